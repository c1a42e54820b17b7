//! ext.Strings `"<format>".format([args])`. Kubernetes enables ext.Strings v2, which selects
//! cel-go's first formatter (locale `en_US`, no precision limit), not the v4 rewrite: `%f` groups
//! thousands, `%e` prints `1.000000×10⁰⁰` and takes its "precision" as a width, and `%s` of a
//! double uses Go's `%g`. Literal format strings over literal lists are validated at compile time
//! ([`check`]) with the static types of the arguments; everything else fails at run time
//! ([`format`](fn@format)).
use super::overload::{Resolved, Sig};
use super::price::{size, tenths};
use crate::cel::func::Func;
use crate::cel::quote::go_quote;
use crate::cel::types::Ty;
use crate::cel::value::{BYTES_NOT_UTF8, EvalResult, Value, no_overload};

/// The names this library declares (a call with other arguments finds no overload).
pub(super) const NAMES: &[&str] = &["format"];

pub(super) fn resolve(s: &Sig) -> Option<Resolved> {
    match (s.name, s.member, s.t.len()) {
        ("format", true, 2) if s.is(0, &Ty::Str) && s.list_like(1) => {
            Some(Ok((Func::Format, Ty::Str)))
        }
        _ => None,
    }
}

pub(super) fn call(f: Func, a: &[Value]) -> EvalResult {
    match (f, &a[0], &a[1]) {
        (Func::Format, Value::Str(s), Value::List(l)) => format(s, l).map(|s| Value::str(&s)),
        _ => no_overload(),
    }
}

pub(super) fn cost(f: Func, a: &[Value]) -> u64 {
    match f {
        Func::Format => tenths(a.first().map(size).unwrap_or(1), 1),
        _ => 1,
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Verb {
    Str,
    Dec,
    Fixed(Option<usize>),
    Sci(Option<usize>),
    Bin,
    Hex(bool),
    Oct,
}

/// Beyond this a precision would only allocate: refused (upstream would try).
const MAX_PRECISION: usize = 1 << 20;

/// Parses the clause after a `%`: how many bytes it took and the verb.
fn clause(rest: &[u8]) -> Result<(usize, Verb), String> {
    let fail = |m: String| format!("could not parse formatting clause: {m}");
    let mut i = 0;
    let mut precision = None;
    if rest[0] == b'.' {
        i = 1;
        loop {
            if i >= rest.len() {
                return Err(fail(
                    "error while parsing precision: could not find end of precision specifier"
                        .into(),
                ));
            }
            if !rest[i].is_ascii_digit() {
                break;
            }
            i += 1;
        }
        let digits = std::str::from_utf8(&rest[1..i]).unwrap_or_default();
        let why = if digits.is_empty() {
            Some("invalid syntax")
        } else if digits.parse::<i64>().is_err() {
            Some("value out of range")
        } else {
            None
        };
        if let Some(why) = why {
            return Err(fail(format!(
                "error while parsing precision: error while converting precision to integer: strconv.Atoi: parsing \"{digits}\": {why}"
            )));
        }
        let p = digits.parse::<usize>().unwrap_or(usize::MAX);
        if p > MAX_PRECISION {
            return Err(fail(format!("precision {p} is too large")));
        }
        precision = Some(p);
    }
    let verb = match rest[i] {
        b's' => Verb::Str,
        b'd' => Verb::Dec,
        b'f' => Verb::Fixed(precision),
        b'e' => Verb::Sci(precision),
        b'b' => Verb::Bin,
        b'x' => Verb::Hex(false),
        b'X' => Verb::Hex(true),
        b'o' => Verb::Oct,
        // upstream prints the byte as a code point (Latin-1 for the lead byte of UTF-8)
        other => {
            return Err(fail(format!(
                "unrecognized formatting clause \"{}\"",
                other as char
            )));
        }
    };
    Ok((i + 1, verb))
}

/// Evaluates `fmt.format(args)`.
pub fn format(fmt: &str, args: &[Value]) -> Result<String, String> {
    let b = fmt.as_bytes();
    let mut out = String::with_capacity(fmt.len());
    let (mut i, mut lit, mut argi) = (0, 0, 0);
    while i < b.len() {
        if b[i] != b'%' {
            i += 1;
            continue;
        }
        out.push_str(&fmt[lit..i]);
        if b.get(i + 1) == Some(&b'%') {
            out.push('%');
            i += 2;
            lit = i;
            continue;
        }
        // the argument is fetched before the clause is looked at
        let Some(arg) = args.get(argi) else {
            return Err(format!("index {argi} out of range"));
        };
        if i + 1 >= b.len() {
            return Err("unexpected end of string".into());
        }
        let (n, verb) = clause(&b[i + 1..])?;
        let s = apply(verb, arg).map_err(|e| format!("error during formatting: {e}"))?;
        out.push_str(&s);
        i += 1 + n;
        lit = i;
        argi += 1;
    }
    out.push_str(&fmt[lit..]);
    Ok(out)
}

fn apply(verb: Verb, v: &Value) -> Result<String, String> {
    use Value::*;
    let t = v.type_name();
    match verb {
        Verb::Str => to_string(v),
        Verb::Dec => match v {
            Int(i) => Ok(i.to_string()),
            Uint(u) => Ok(u.to_string()),
            _ => Err(format!(
                "decimal clause can only be used on integers, was given {t}"
            )),
        },
        Verb::Fixed(p) => match float_arg(v) {
            Some(x) => Ok(fixed_en_us(x, p.unwrap_or(6))),
            None => Err(format!(
                "fixed-point clause can only be used on doubles, was given {t}"
            )),
        },
        Verb::Sci(w) => match float_arg(v) {
            Some(x) => Ok(sci_en_us(x, w.unwrap_or(6))),
            None => Err(format!(
                "scientific clause can only be used on doubles, was given {t}"
            )),
        },
        Verb::Bin => match v {
            Int(i) => Ok(signed(*i, |u| format!("{u:b}"))),
            Uint(u) => Ok(format!("{u:b}")),
            Bool(b) => Ok(if *b { "1" } else { "0" }.into()),
            _ => Err(format!(
                "only integers and bools can be formatted as binary, was given {t}"
            )),
        },
        Verb::Hex(upper) => {
            let s = match v {
                Str(s) => hex(s.as_bytes()),
                Bytes(b) => hex(b),
                Int(i) => signed(*i, |u| format!("{u:x}")),
                Uint(u) => format!("{u:x}"),
                _ => {
                    return Err(format!(
                        "only integers, byte buffers, and strings can be formatted as hex, was given {t}"
                    ));
                }
            };
            Ok(if upper { s.to_ascii_uppercase() } else { s })
        }
        Verb::Oct => match v {
            Int(i) => Ok(signed(*i, |u| format!("{u:o}"))),
            Uint(u) => Ok(format!("{u:o}")),
            _ => Err(format!(
                "octal clause can only be used on integers, was given {t}"
            )),
        },
    }
}

/// `%f`/`%e` take doubles, and the three strings that convert to the non-finite ones.
fn float_arg(v: &Value) -> Option<f64> {
    match v {
        Value::Double(x) => Some(*x),
        Value::Str(s) => match s.as_ref() {
            "NaN" => Some(f64::NAN),
            "Infinity" => Some(f64::INFINITY),
            "-Infinity" => Some(f64::NEG_INFINITY),
            _ => None,
        },
        _ => None,
    }
}

/// Go's `%b`/`%x`/`%o` of a signed integer: a minus sign and the magnitude.
fn signed(i: i64, f: impl Fn(u64) -> String) -> String {
    let s = f(i.unsigned_abs());
    if i < 0 { format!("-{s}") } else { s }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// x/text's en_US `%.Nf`: thousands grouped, no sign on negative zero, `∞` for infinities.
fn fixed_en_us(x: f64, p: usize) -> String {
    if x.is_nan() {
        return "NaN".into();
    }
    let sign = if x < 0.0 { "-" } else { "" };
    if x.is_infinite() {
        return format!("{sign}∞");
    }
    let s = format!("{:.p$}", x.abs());
    let (int, frac) = s.split_at(s.find('.').unwrap_or(s.len()));
    let mut grouped = String::with_capacity(int.len() * 4 / 3 + 1);
    for (k, c) in int.chars().enumerate() {
        if k > 0 && (int.len() - k) % 3 == 0 {
            grouped.push(',');
        }
        grouped.push(c);
    }
    format!("{sign}{grouped}{frac}")
}

/// x/text's en_US `%<w>e`: six decimals, `×10` and a superscript exponent of at least two
/// digits, padded on the left to `w` characters.
fn sci_en_us(x: f64, width: usize) -> String {
    let sign = if x < 0.0 { "-" } else { "" };
    let body = if x.is_nan() {
        "NaN".to_string()
    } else if x.is_infinite() {
        format!("{sign}∞")
    } else {
        let s = format!("{:.6e}", x.abs());
        let (mant, exp) = s.split_once('e').unwrap_or((&s, "0"));
        let exp: i32 = exp.parse().unwrap_or(0);
        const SUP: [char; 10] = ['⁰', '¹', '²', '³', '⁴', '⁵', '⁶', '⁷', '⁸', '⁹'];
        let mut out = format!("{sign}{mant}×10");
        if exp < 0 {
            out.push('⁻');
        }
        for d in format!("{:02}", exp.unsigned_abs()).bytes() {
            out.push(SUP[(d - b'0') as usize]);
        }
        out
    };
    let n = body.chars().count();
    if n < width {
        format!("{}{body}", " ".repeat(width - n))
    } else {
        body
    }
}

/// `%s`: what `string(x)` gives for scalars, CEL-literal-like text for lists and maps.
fn to_string(v: &Value) -> Result<String, String> {
    use Value::*;
    Ok(match v {
        List(_) | Map(_) => return aggregate(v),
        Int(i) => i.to_string(),
        Uint(u) => u.to_string(),
        Double(x) => go_g(*x),
        Bool(b) => b.to_string(),
        Str(s) => s.to_string(),
        Bytes(b) => match std::str::from_utf8(b) {
            Ok(s) => s.to_string(),
            Err(_) => {
                return Err(format!(
                    "could not convert argument {BYTES_NOT_UTF8:?} to string"
                ));
            }
        },
        Type(t) => t.to_string(),
        Null => "null".into(),
        _ => {
            return Err(format!(
                "string clause can only be used on strings, bools, bytes, ints, doubles, maps, lists, types, durations, and timestamps, was given {}",
                v.type_name()
            ));
        }
    })
}

/// A list or map member: strings and bytes quoted, doubles as `%.6f` (non-finite ones quoted).
fn member(v: &Value) -> Result<String, String> {
    use Value::*;
    Ok(match v {
        Int(i) => i.to_string(),
        Uint(u) => u.to_string(),
        Str(_) => go_quote(&to_string(v)?),
        Bytes(_) => format!("b{}", go_quote(&to_string(v)?)),
        Bool(_) | Null | Type(_) | List(_) | Map(_) => to_string(v)?,
        Double(x) if x.is_nan() => "\"NaN\"".into(),
        Double(x) if x.is_infinite() => if *x > 0.0 { "\"+Inf\"" } else { "\"-Inf\"" }.into(),
        Double(x) => format!("{x:.6}"),
        _ => return Err(format!("no formatting function for {}", v.type_name())),
    })
}

fn aggregate(v: &Value) -> Result<String, String> {
    match v {
        Value::List(l) => {
            let items: Result<Vec<String>, String> = l.iter().map(member).collect();
            Ok(format!("[{}]", items?.join(", ")))
        }
        Value::Map(m) => {
            let mut pairs = Vec::with_capacity(m.entries.len());
            for (k, val) in &m.entries {
                let key = match k {
                    Value::Str(_) | Value::Bool(_) | Value::Int(_) | Value::Uint(_) => member(k)?,
                    _ => {
                        return Err(format!(
                            "no formatting function for map key of type {}",
                            k.type_name()
                        ));
                    }
                };
                pairs.push((key, member(val)?));
            }
            // ordered by the printed key, quotes included
            pairs.sort_by(|a, b| a.0.cmp(&b.0));
            let items: Vec<String> = pairs.into_iter().map(|(k, v)| format!("{k}:{v}")).collect();
            Ok(format!("{{{}}}", items.join(", ")))
        }
        _ => to_string(v),
    }
}

/// Go's `%g`: shortest digits, exponent form for exponents below -4 or from 6 on.
pub fn go_g(x: f64) -> String {
    if x.is_nan() {
        return "NaN".into();
    }
    if x.is_infinite() {
        return if x > 0.0 { "+Inf" } else { "-Inf" }.into();
    }
    let s = format!("{:e}", x.abs());
    let (mant, exp) = s.split_once('e').unwrap_or((&s, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let digits: String = mant.chars().filter(|c| *c != '.').collect();
    let sign = if x.is_sign_negative() { "-" } else { "" };
    let body = if !(-4..6).contains(&exp) {
        let (d0, rest) = digits.split_at(1);
        let dot = if rest.is_empty() { "" } else { "." };
        let esign = if exp < 0 { '-' } else { '+' };
        format!("{d0}{dot}{rest}e{esign}{:02}", exp.unsigned_abs())
    } else if exp < 0 {
        format!("0.{}{digits}", "0".repeat(exp.unsigned_abs() as usize - 1))
    } else {
        let dp = exp.unsigned_abs() as usize + 1;
        if digits.len() <= dp {
            format!("{digits}{}", "0".repeat(dp - digits.len()))
        } else {
            format!("{}.{}", &digits[..dp], &digits[dp..])
        }
    };
    format!("{sign}{body}")
}

/// A `format` argument as the compile-time check sees it: its expression id, static type, and
/// for list and map literals the members (map keys and values in turn).
pub struct StaticArg {
    pub id: u64,
    pub ty: Ty,
    pub members: Vec<StaticArg>,
}

/// Where a compile-time error points: the call, or an argument expression.
pub type CheckError = (Option<u64>, String);

/// cel-go's check of a literal format string against a literal argument list.
pub fn check(fmt: &str, args: &[StaticArg]) -> Result<(), CheckError> {
    let b = fmt.as_bytes();
    let (mut i, mut argi, mut requested) = (0, 0, 0);
    while i < b.len() {
        if b[i] != b'%' {
            i += 1;
            continue;
        }
        if b.get(i + 1) == Some(&b'%') {
            i += 2;
            continue;
        }
        requested += 1;
        if i + 1 >= b.len() {
            return Err((None, "unexpected end of string".into()));
        }
        let Some(arg) = args.get(argi) else {
            return Err((None, format!("index {argi} out of range")));
        };
        let (n, verb) = clause(&b[i + 1..]).map_err(|e| (None, e))?;
        check_arg(verb, arg)
            .map_err(|(id, m)| (Some(id), format!("error during formatting: {m}")))?;
        i += 1 + n;
        argi += 1;
    }
    if args.len() > requested {
        return Err((
            None,
            format!(
                "too many arguments supplied to string.format (expected {requested}, got {})",
                args.len()
            ),
        ));
    }
    Ok(())
}

/// Upstream's type names in these errors: parameterized types by their base name.
fn kind_name(t: &Ty) -> String {
    match t {
        Ty::List(_) => "list".into(),
        Ty::Map(..) => "map".into(),
        Ty::Opt(_) => "optional_type".into(),
        other => other.to_string(),
    }
}

fn check_arg(verb: Verb, a: &StaticArg) -> Result<(), (u64, String)> {
    use Ty::*;
    let t = &a.ty;
    let ok = t.is_dyn()
        || match verb {
            Verb::Str => return check_str(a),
            Verb::Dec | Verb::Oct => matches!(t, Int | Uint),
            Verb::Fixed(_) | Verb::Sci(_) => matches!(t, Double | Str),
            Verb::Bin => matches!(t, Int | Uint | Bool),
            Verb::Hex(_) => matches!(t, Int | Uint | Str | Bytes),
        };
    if ok {
        return Ok(());
    }
    let what = match verb {
        Verb::Dec => "decimal clause can only be used on integers",
        Verb::Oct => "octal clause can only be used on integers",
        Verb::Fixed(_) => "fixed-point clause can only be used on doubles",
        Verb::Sci(_) => "scientific clause can only be used on doubles",
        Verb::Bin => "only integers and bools can be formatted as binary",
        _ => "only integers, byte buffers, and strings can be formatted as hex",
    };
    Err((a.id, format!("{what}, was given {}", kind_name(t))))
}

fn check_str(a: &StaticArg) -> Result<(), (u64, String)> {
    use Ty::*;
    let ok = a.ty.is_dyn()
        || matches!(
            a.ty,
            List(_) | Map(..) | Int | Uint | Double | Bool | Str | Bytes | Type | Null
        );
    if !ok {
        return Err((
            a.id,
            format!(
                "string clause can only be used on strings, bools, bytes, ints, doubles, maps, lists, types, durations, and timestamps, was given {}",
                kind_name(&a.ty)
            ),
        ));
    }
    a.members.iter().try_for_each(check_str)
}
