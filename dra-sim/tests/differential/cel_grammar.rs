//! The CEL-only grammar of the differential test. It aims at the corners where our CEL
//! environment and cel-go can part ways, rather than at realistic selectors:
//!
//! - every operator (`+ - * / %`, the comparisons, `in`, `&&`, `||`, `!`, unary `-`, `?:`,
//!   indexing) on operands of every type: attribute values of each kind (int, string, bool,
//!   version, missing), capacity quantities (also as `add`/`sub` return them), literals of every
//!   CEL type, and all of them behind `dyn`; mostly of one type, often mixed (compile errors, and
//!   runtime errors behind `dyn` and attributes, which cel-go types as `dyn`);
//! - macros (`all`, `exists`, `exists_one`, `filter`, `map`, the two-variable forms and
//!   transforms) over lists and maps some of whose members make the predicate fail, to check
//!   how errors combine with the other members' results;
//! - `has()`, `.?`, `[?]` and the optional functions on present and missing keys, domains and
//!   values, and on values that are not maps;
//! - expressions that start with a unary minus, and negations nested anywhere;
//! - what cel-go computes when planning: conversions of constants, literals of constants (with
//!   keys Go cannot hash), `in` over constant lists, constant regex patterns;
//! - library functions with edge-case arguments (`cel_library.rs`).
//!
//! `$g` stands for the driver's attribute map, `$c` for its capacity map.
use super::Rng;
use super::cel_library::{call, macro_pred, optional_pred, planned_pred};

/// Operands by type family; attribute values of each kind are among them.
pub const INTS: &[&str] = &[
    "1",
    "0",
    "-1",
    "2",
    "7",
    "-7",
    "3",
    "9223372036854775807",
    "-9223372036854775808",
    "$g.cores",
    "$g['cores']",
    "$g.nope",
    "-$g.cores",
    "size('abc')",
    "int('12')",
    "$c.memory.asInteger()",
    "lists.range(3).size()",
];
pub const UINTS: &[&str] = &[
    "0u",
    "1u",
    "2u",
    "7u",
    "18446744073709551615u",
    "uint(3)",
    "uint($g.cores)",
];
pub const DOUBLES: &[&str] = &[
    "0.0",
    "-0.0",
    "1.5",
    "2.0",
    "1.0",
    "1e-5",
    "1e300",
    "-1e300",
    "0.1",
    "double('NaN')",
    "double('inf')",
    "-double('-Infinity')",
    "9.223372036854775807e18",
    "1e19",
    "double($g.cores)",
    "$c.memory.asApproximateFloat()",
];
pub const STRINGS: &[&str] = &[
    "''",
    "'a'",
    "'abc'",
    "'héllo'",
    "'1'",
    "'-1'",
    "'1.5'",
    "'true'",
    "'a,b,c'",
    "$g.model",
    "$g['model']",
    "device.attributes['other.example.com'].zone",
    "device.driver",
    "$g.pcieRoot",
    "string($g.cores)",
];
pub const BOOLS: &[&str] = &[
    "true",
    "false",
    "$g.ecc",
    "device.allowMultipleAllocations",
    "has($g.ecc)",
];
pub const BYTES: &[&str] = &["b''", "b'ab'", "b'\\xff'", "bytes('é')", "bytes($g.model)"];
pub const LISTS: &[&str] = &[
    "[1, 2, 3]",
    "[3, 1, 2]",
    "['b', 'a']",
    "[1.5, 0.5]",
    "[1u, 2u]",
    "[true, false]",
    "[[1], [2, 3]]",
    "[dyn(1), dyn('a')]",
    "[dyn(1), dyn(1.5), dyn(2u)]",
    "[]",
    "[[]]",
    "[] + [1]",
    "dyn([])",
    "lists.range(3)",
    "[9223372036854775807, 1]",
    "[$g.cores, 1]",
    "[$g.cores, dyn(1)]",
    "[$g.model]",
    "[$g.nope, dyn(1)]",
    "[1, 1 / 0]",
    "$g.model.split('0')",
];
pub const MAPS: &[&str] = &[
    "{'a': 1}",
    "{}",
    "{'a': 1, 'b': 2}",
    "{'a': 0, 'b': 1}",
    "{1: 'x'}",
    "{1u: 'y'}",
    "{true: 1}",
    "{dyn(1): 'i', dyn(2u): 'u'}",
    "{dyn(1.0): 'd'}",
    "{'a': $g.cores}",
    "$g",
    "$c",
    "device.attributes",
    "device.attributes['none.example.com']",
];
pub const VERSIONS: &[&str] = &[
    "$g.driverVersion",
    "semver('1.2.3')",
    "semver('v1.0', true)",
    "semver('2.0.0-rc.1')",
];
pub const QUANTITIES: &[&str] = &[
    "$c.memory",
    "device.capacity['other.example.com'].slots",
    "quantity('1Gi')",
    "quantity('1.5')",
    "quantity('0')",
    "quantity('-2')",
    "$c.memory.add(1)",
    "quantity('1').sub(quantity('1'))",
];
pub const OTHERS: &[&str] = &[
    "null",
    "int",
    "string",
    "type(1)",
    "optional.of(1)",
    "optional.none()",
    "ip('10.0.0.1')",
    "cidr('10.0.0.0/8')",
    "url('https://x/y')",
    "dyn(null)",
    "format.dns1123Label()",
];

pub const FAMILIES: &[&[&str]] = &[
    INTS, UINTS, DOUBLES, STRINGS, BOOLS, BYTES, LISTS, MAPS, VERSIONS, QUANTITIES, OTHERS,
];

/// One operand of a family, sometimes behind `dyn`.
pub fn operand(r: &mut Rng, fam: &[&str]) -> String {
    let s = expand(*r.pick(fam));
    if r.coin(12) { format!("dyn({s})") } else { s }
}

/// `$g` and `$c` spelled out.
pub fn expand(s: impl AsRef<str>) -> String {
    s.as_ref()
        .replace("$g", "device.attributes[\"gpu.example.com\"]")
        .replace("$c", "device.capacity[\"gpu.example.com\"]")
}

/// A family, mostly a scalar one.
fn family(r: &mut Rng) -> &'static [&'static str] {
    if r.coin(60) {
        FAMILIES[r.n(5)]
    } else {
        FAMILIES[r.n(FAMILIES.len())]
    }
}

/// A term of any family.
pub fn term(r: &mut Rng, depth: usize) -> String {
    let fam = family(r);
    term_of(r, fam, depth)
}

/// The binary operators that make a value of their operands' type.
const ARITH: &[&str] = &["+", "-", "*", "/", "%"];
/// The operators that make a bool of any two operands.
const RELATIONS: &[&str] = &["==", "!=", "<", "<=", ">", ">=", "in"];

fn numeric(fam: &[&str]) -> bool {
    fam == INTS || fam == UINTS || fam == DOUBLES
}

/// The arithmetic operators a family's values take (`+` joins strings, bytes and lists).
fn arith_ops(fam: &[&str]) -> &'static [&'static str] {
    if fam == INTS || fam == UINTS {
        ARITH
    } else if fam == DOUBLES {
        &ARITH[..4]
    } else if fam == STRINGS || fam == BYTES || fam == LISTS {
        &ARITH[..1]
    } else {
        &[]
    }
}

/// The relations a family's values take: equality always, ordering for scalars.
fn relation_ops(fam: &[&str]) -> &'static [&'static str] {
    if numeric(fam) || fam == STRINGS || fam == BOOLS || fam == BYTES {
        &RELATIONS[..6]
    } else {
        &RELATIONS[..2]
    }
}

/// A term of roughly one family: an operand, or an operator or function over operands of it.
/// Mostly well typed, so that most expressions reach evaluation; now and then an operator the
/// family does not take, or an operand of another family.
fn term_of(r: &mut Rng, fam: &[&str], depth: usize) -> String {
    if depth == 0 || r.coin(40) {
        return operand(r, fam);
    }
    let same = |r: &mut Rng| {
        if r.coin(92) {
            term_of(r, fam, depth - 1)
        } else {
            term(r, depth - 1)
        }
    };
    let ops = arith_ops(fam);
    match r.n(9) {
        0..=2 if !ops.is_empty() || r.coin(10) => {
            let op = if ops.is_empty() || r.coin(8) {
                r.pick(ARITH)
            } else {
                r.pick(ops)
            };
            format!("({} {op} {})", same(r), same(r))
        }
        3 if numeric(fam) || r.coin(10) => format!("-{}", same(r)),
        4 => format!("({} ? {} : {})", pred(r, depth - 1), same(r), same(r)),
        5 => format!("[{}, {}][{}]", same(r), same(r), index(r)),
        6 => format!("dyn({})", same(r)),
        7 => format!("{}.?x.orValue({})", operand(r, MAPS), same(r)),
        8 => format!("cel.bind(v, {}, v)", same(r)),
        _ => operand(r, fam),
    }
}

pub fn index(r: &mut Rng) -> String {
    expand(r.pick(&[
        "0", "1", "2", "-1", "1u", "1.0", "1.5", "'a'", "dyn(0)", "$g.cores",
    ]))
}

/// A boolean expression (a selector): a single atom, or atoms joined by the logical operators.
pub fn pred(r: &mut Rng, depth: usize) -> String {
    if depth == 0 || r.coin(50) {
        return pred_atom(r, depth);
    }
    let d = depth - 1;
    match r.n(4) {
        0 => format!("({} && {})", pred(r, d), pred(r, d)),
        1 => format!("({} || {})", pred(r, d), pred(r, d)),
        // `!-x` is no CEL (one kind of unary operator a chain): the negated atom in parentheses
        2 => format!("!({})", pred(r, d)),
        _ => format!("({} ? {} : {})", pred(r, d), pred(r, d), pred(r, d)),
    }
}

fn pred_atom(r: &mut Rng, depth: usize) -> String {
    let d = depth.min(2);
    match r.n(20) {
        0..=3 => relation(r, d),
        4 => operator_matrix(r),
        5..=6 => leading_minus(r),
        7 => {
            let fam = if r.coin(50) { LISTS } else { MAPS };
            let (x, c) = (term(r, d), operand(r, fam));
            // behind `dyn`, any member type compiles
            if r.coin(50) {
                format!("dyn({x}) in {c}")
            } else {
                format!("{x} in {c}")
            }
        }
        8..=10 => macro_pred(r),
        11..=12 => optional_pred(r),
        13..=14 => planned_pred(r),
        15 => format!("type({}) == {}", term(r, d), type_name(r)),
        16 => operand(r, BOOLS),
        17 => logical_mix(r),
        _ => {
            let c = call(r, d);
            match r.n(3) {
                0 => format!("[{c}].size() == 1"),
                1 => format!("type({c}) == {}", type_name(r)),
                _ => format!("dyn({c}) == dyn({})", call(r, d)),
            }
        }
    }
}

/// A comparison of two terms, mostly of one family and by a relation it takes.
pub fn relation(r: &mut Rng, d: usize) -> String {
    let fam = family(r);
    let ops = relation_ops(fam);
    let op = if r.coin(90) {
        r.pick(ops)
    } else {
        r.pick(&RELATIONS[..6])
    };
    let (a, b) = if r.coin(88) {
        (term_of(r, fam, d), term_of(r, fam, d))
    } else {
        (term(r, d), term(r, d))
    };
    format!("{a} {op} {b}")
}

/// One operator over one operand of every family (attribute values, quantities, literals,
/// `dyn`): its value compared with another operand, or only whether it can be computed.
pub fn operator_matrix(r: &mut Rng) -> String {
    let lf = *r.pick(FAMILIES);
    let rf = if r.coin(55) { lf } else { *r.pick(FAMILIES) };
    let (a, b) = (operand(r, lf), operand(r, rf));
    let ops = [ARITH, RELATIONS].concat();
    let op = *r.pick(&ops);
    if RELATIONS.contains(&op) {
        return format!("{a} {op} {b}");
    }
    let v = format!("({a} {op} {b})");
    match r.n(4) {
        0 => format!("[{v}].size() == 1"),
        1 => format!("type({v}) == {}", type_name(r)),
        2 => format!("dyn({v}) == dyn({})", operand(r, lf)),
        _ => format!("{v} == {}", operand(r, lf)),
    }
}

/// A selector that starts with a unary minus (over attribute values, literals, calls).
pub fn leading_minus(r: &mut Rng) -> String {
    let x = r.pick(&[
        "$g.cores",
        "$g.model",
        "$g.nope",
        "1",
        "-1",
        "(-1)",
        "9223372036854775807",
        "(-9223372036854775808)",
        "-9223372036854775808",
        "1.5",
        "dyn(1u)",
        "dyn(-9223372036854775808)",
        "size('ab')",
        "$c.memory",
        "$c.memory.sign()",
        "double('NaN')",
        "-$g.cores",
        "(1 - 2)",
    ]);
    let minus = *r.pick(&["-", "-", "- -", "--", "-(-"]);
    let close = if minus.contains('(') { ")" } else { "" };
    let fam = *r.pick(&[INTS, DOUBLES, UINTS]);
    let rhs = operand(r, fam);
    // numbers of different types compare in order, but are equal only behind `dyn`
    let op = *r.pick(&RELATIONS[..6]);
    let rhs = if op.contains('=') && op.len() == 2 && !op.starts_with(['<', '>']) {
        format!("dyn({rhs})")
    } else {
        rhs
    };
    format!("{minus}{}{close} {op} {rhs}", expand(x))
}

/// `&&`, `||`, `!` and `?:` over operands that are not all bools (static or behind `dyn`).
pub fn logical_mix(r: &mut Rng) -> String {
    let side = |r: &mut Rng| {
        if r.coin(60) {
            operand(r, BOOLS)
        } else {
            let fam = *r.pick(FAMILIES);
            operand(r, fam)
        }
    };
    let (a, b) = (side(r), side(r));
    match r.n(4) {
        0 => format!("{a} && {b}"),
        1 => format!("{a} || {b}"),
        2 => format!("!{a}"),
        _ => format!("({a} ? {b} : {})", side(r)),
    }
}

pub fn type_name(r: &mut Rng) -> &'static str {
    const TYPES: &[&str] = &[
        "int",
        "uint",
        "double",
        "string",
        "bool",
        "list",
        "map",
        "null_type",
        "bytes",
        "type",
        "optional_type",
    ];
    TYPES[r.n(TYPES.len())]
}
