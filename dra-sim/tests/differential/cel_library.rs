//! The CEL-only grammar's library calls, macros, optionals and planned constants (see
//! `cel_grammar.rs`).
use super::Rng;
use super::cel_grammar::{
    DOUBLES, INTS, LISTS, MAPS, QUANTITIES, STRINGS, VERSIONS, expand, index, operand, term,
};

/// Library calls with edge-case arguments, any result type.
pub fn call(r: &mut Rng, depth: usize) -> String {
    let s = operand(r, STRINGS);
    let l = operand(r, LISTS);
    let i = operand(r, INTS);
    match r.n(14) {
        0 => format!("{s}.{}", r.pick(STRING_CALLS)),
        1 => {
            // `join` takes a list of strings only
            let l = if r.coin(70) {
                operand(r, &LISTS[2..3])
            } else {
                l
            };
            format!("{l}.{}", r.pick(LIST_CALLS))
        }
        2 => format!(
            "{}({})",
            r.pick(&[
                "string", "int", "uint", "double", "bool", "bytes", "type", "dyn"
            ]),
            term(r, depth)
        ),
        3 => format!("string({})", operand(r, DOUBLES)),
        4 => format!("lists.range({i})"),
        5 => format!("strings.quote({s})"),
        6 => format!("{}.{}", operand(r, QUANTITIES), r.pick(QUANTITY_CALLS)),
        7 => format!(
            "quantity({})",
            r.pick(&["'1Gi'", "''", "'1e30'", "'1.5'", "'-0'", "'1Z'", "'0.5m'"])
        ),
        8 => format!(
            "semver({})",
            r.pick(&[
                "'1.0'",
                "'1.0.0'",
                "'v1.0.0', true",
                "'1.0', true",
                "'01.2.3'"
            ])
        ),
        9 => format!(
            "{}.{}",
            operand(r, VERSIONS),
            r.pick(&[
                "major()",
                "minor()",
                "patch()",
                "compareTo(semver('1.2.3'))"
            ])
        ),
        10 => r.pick(NET_CALLS).to_string(),
        11 => format!(
            "{}['{}']",
            operand(r, MAPS),
            r.pick(&["a", "model", "cores", "nope", "gpu.example.com"])
        ),
        12 => format!(
            "{}[{}]",
            operand(r, MAPS),
            r.pick(&[
                "1", "1u", "1.0", "2", "2u", "2.0", "true", "dyn(1)", "dyn(1.0)", "'a'"
            ])
        ),
        _ => format!(
            "'%{}'.format([{}])",
            r.pick(&["s", "d", "f", "e", "x", "b", "o", ".3f"]),
            term(r, depth)
        ),
    }
}

const STRING_CALLS: &[&str] = &[
    "indexOf('c', 5)",
    "indexOf('', 3)",
    "indexOf('', 4)",
    "indexOf('a', -1)",
    "lastIndexOf('a', 10)",
    "lastIndexOf('', 3)",
    "lastIndexOf('', 4)",
    "lastIndexOf('b', -1)",
    "lastIndexOf('a', 0)",
    "indexOf('b')",
    "charAt(3)",
    "charAt(4)",
    "charAt(-1)",
    "substring(2, 1)",
    "substring(0, 10)",
    "substring(1)",
    "replace('', 'x')",
    "replace('a', 'b', 0)",
    "replace('a', 'b', -1)",
    "split('')",
    "split(',', 0)",
    "split(',', -1)",
    "split(',', 2)",
    "lowerAscii()",
    "upperAscii()",
    "trim()",
    "reverse()",
    "size()",
    "matches('^[a-z]+$')",
    "find('[0-9]+')",
    "findAll('[a-z]', 2)",
];

const LIST_CALLS: &[&str] = &[
    "isSorted()",
    "sum()",
    "min()",
    "max()",
    "indexOf(1)",
    "lastIndexOf(1)",
    "indexOf(dyn(1.0))",
    "slice(2, 1)",
    "slice(-1, 1)",
    "slice(0, 10)",
    "slice(1, 2)",
    "flatten()",
    "flatten(-1)",
    "flatten(1)",
    "distinct()",
    "sort()",
    "first()",
    "last()",
    "reverse()",
    "join()",
    "join(',')",
    "size()",
    "includes(1)",
    "sortBy(x, -x)",
];

const QUANTITY_CALLS: &[&str] = &[
    "add(1)",
    "sub(quantity('1'))",
    "add(9223372036854775807)",
    "asInteger()",
    "asApproximateFloat()",
    "sign()",
    "isInteger()",
    "compareTo(quantity('1Gi'))",
    "isGreaterThan(quantity('1').add(0))",
];

const NET_CALLS: &[&str] = &[
    "cidr('10.0.0.0/33')",
    "cidr('x')",
    "ip('1.2.3')",
    "ip('::1').family()",
    "cidr('10.0.0.0/8').prefixLength()",
    "url('x')",
    "url('https://a/b').getHost()",
    "url('https://a/b?q=1').getQuery()",
    "cidr('10.0.0.0/8').containsIP('10.1.2.3')",
    "cidr('10.0.0.0/8').containsIP('x')",
    "cidr('::/0').containsCIDR('10.0.0.0/8')",
];

/// Ranges for the macros: lists and maps some of whose members make the bodies below fail
/// (zero divides, strings and lists are not numbers), attribute maps, and ranges that fail.
const RANGES: &[&str] = &[
    "[0, 1, 2]",
    "[1, 0]",
    "[0]",
    "[2, 1]",
    "[dyn(1), dyn('a'), dyn(2)]",
    "[dyn('a'), dyn(0)]",
    "[dyn([1]), dyn(2)]",
    "[1, 2, 3]",
    "[]",
    "{}",
    "[[]]",
    "[] + [1]",
    "dyn([])",
    "['a', 'b', '']",
    "{'a': 1, 'b': 0}",
    "{0: 'a', 2: 'b'}",
    "[$g.cores, dyn(0)]",
    "[$g.nope, dyn(1)]",
    "[1, 1 / 0]",
    "$g",
    "device.attributes",
    "$c",
    "dyn(1)",
    "lists.range(4)",
];

/// First uses of `x` that bind the element type of an empty range (cel-go holds every later use
/// of `x` to it), by operators and by the first overload of a one-operand function.
const BINDERS: &[&str] = &[
    "x != 1",
    "x == 'a'",
    "x == [1]",
    "x + 1 > 0",
    "x * 2.0 > 0.0",
    "x < 1.5",
    "1.5 < x",
    "2u <= x",
    "x in ['a']",
    "x in {1: 2}",
    "1 in x",
    "size(x) > 0",
    "-x < 0",
    "!x",
    "int(x) > 0",
    "string(x) != ''",
];

const BODIES: &[&str] = &[
    "10 / x > 1",
    "10 / x == 5",
    "x > 1",
    "x == 1",
    "10 % x == 0",
    "x.size() > 0",
    "int(x) > 0",
    "x != 0 && 10 / x > 2",
    "10 / x > 2 || x == 0",
    "[x][1] == x",
    "x",
    "-x < 0",
    "has(x.a)",
    "x.exists(y, 10 / y > 0)",
    "string(x) != 'a'",
];

/// Macros over ranges some of whose members make the body fail.
pub fn macro_pred(r: &mut Rng) -> String {
    // behind `dyn`, every body compiles and fails (or not) member by member
    let range = expand(*r.pick(RANGES));
    let range = if r.coin(35) {
        format!("dyn({range})")
    } else {
        range
    };
    let body = expand(*r.pick(BODIES));
    // `existsOne` takes two variables only (cel-go has no one-variable form of it)
    let m = *r.pick(&["all", "exists", "exists_one", "existsOne"]);
    let m1 = if m == "existsOne" && r.coin(75) {
        "exists_one"
    } else {
        m
    };
    match r.n(10) {
        0 => format!("{range}.filter(x, {body}).size() > 0"),
        1 => format!("{range}.map(x, {body}).size() > 0"),
        2 => format!("{range}.map(x, {}, {body}).exists(y, y)", r.pick(BINDERS)),
        9 => format!("{range}.all(x, {} || {body})", r.pick(BINDERS)),
        3 => format!("{range}.{m}(i, x, {body})"),
        4 => format!("{range}.transformList(i, x, {body}).size() == 2"),
        5 => format!("{range}.transformMap(i, x, {body}).size() > 0"),
        6 => format!("{range}.{m1}(x, {body}) == {}", r.pick(&["true", "false"])),
        _ => format!("{range}.{m1}(x, {body})"),
    }
}

/// `has()`, `.?`, `[?]` and the optional functions on present and missing keys and domains,
/// and on values that are not maps.
pub fn optional_pred(r: &mut Rng) -> String {
    let holder = expand(r.pick(&[
        "$g",
        "$c",
        "device.attributes['none.example.com']",
        "device.attributes['other.example.com']",
        "{'a': 1}",
        "{1: 'x'}",
        "dyn({'a': 1})",
        "dyn(1)",
        "dyn('a')",
        "dyn([1])",
        "optional.of({'a': 1})",
        "optional.none()",
        "optional.of(1)",
    ]));
    let key = *r.pick(&["a", "model", "nope", "memory", "cores", "zone"]);
    let fam = *r.pick(&[INTS, STRINGS]);
    let default = operand(r, fam);
    match r.n(9) {
        0 => format!("has({holder}.{key})"),
        1 => format!("{holder}.?{key}.hasValue()"),
        2 => format!("{holder}.?{key}.orValue({default}) == {default}"),
        3 => format!("{holder}[?'{key}'].orValue({default}) != {default}"),
        4 => format!("{holder}[?{}].hasValue()", index(r)),
        5 => format!("{holder}.?{key}.value() == {default}"),
        6 => format!("{holder}.{key} == {default}"),
        7 => format!("{holder}.?{key}.or(optional.of({default})).value() == {default}"),
        _ => format!("optional.ofNonZeroValue({}).hasValue()", {
            let fam = *r.pick(&[INTS, STRINGS, LISTS, MAPS]);
            operand(r, fam)
        }),
    }
}

/// What cel-go computes when planning (`OptOptimize`): conversions of constants, literals of
/// constants (keys Go cannot hash), `in` over constant lists, constant regex patterns, constant
/// indexes of every type; and quantities as `add`/`sub` return them.
pub fn planned_pred(r: &mut Rng) -> String {
    let x = r.pick(&[
        "1",
        "1u",
        "1.0",
        "1.5",
        "'a'",
        "b'a'",
        "null",
        "9.223372036854775807e18",
        "9223372036854775807",
        "$g.cores",
        "$g.model",
        "$g.driverVersion",
        "$c.memory",
        "[1]",
        "format.dns1123Label()",
    ]);
    let x = format!("dyn({})", expand(x));
    match r.n(8) {
        0 => format!(
            "{}({}) != dyn(0)",
            r.pick(&["int", "uint", "double", "string", "bool", "bytes"]),
            r.pick(&[
                "'1.5'", "'12'", "'-1'", "-1", "1e19", "'true'", "'maybe'", "b'\\xff'", "1.5",
                "dyn('x')", "[1]", "'NaN'",
            ])
        ),
        1 => format!(
            "{x} in [{}]",
            r.pick(&[
                "1, 2.0, 'a'",
                "1u",
                "9223372036854775807",
                "9.223372036854775807e18",
                "dyn(1), dyn(true)",
                "b'a'",
                "[1]",
                "dyn(null)",
            ])
        ),
        2 => format!("{x} in {}", operand(r, MAPS)),
        3 => format!("{{{x}: 1}}.size() == 1"),
        4 => format!("{}[{x}] == 1", operand(r, MAPS)),
        5 => format!(
            "'a1'.{}",
            r.pick(&["matches(P)", "find(P) == 'a'", "findAll(P).size() > 0"])
                .replace('P', &format!("dyn('{}')", r.pick(&["[a-z]", "[", "a("])))
        ),
        6 => {
            let q = expand(*r.pick(QUANTITIES));
            let p = expand(*r.pick(QUANTITIES));
            format!("{q} {} {p}", r.pick(&["==", "!="]))
        }
        _ => format!(
            "{}.{}",
            operand(r, LISTS),
            r.pick(&[
                "sort() == [1]",
                "min() == 1",
                "max() > 1",
                "isSorted()",
                "sum() == 3"
            ])
        ),
    }
}
