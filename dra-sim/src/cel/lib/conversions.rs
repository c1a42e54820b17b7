//! cel-go's standard conversions: `int`, `uint`, `double`, `string`, `bool`, `bytes`, `type`, `dyn`.
use super::overload::{Resolved, Sig};
use crate::cel::func::Func;
use crate::cel::types::Ty;
use crate::cel::value::{
    BYTES_NOT_UTF8, EvalResult, Value, b, double_to_int, double_to_uint, no_overload,
};

/// The names this library declares (a call with other arguments finds no overload).
pub(super) const NAMES: &[&str] = &[
    "int", "uint", "double", "string", "bool", "bytes", "type", "dyn",
];

pub(super) fn resolve(s: &Sig) -> Option<Resolved> {
    use Func as F;
    use Ty::*;
    let (name, t, n) = (s.name, s.t, s.t.len());
    match (name, s.member, n) {
        ("int", false, 1) if matches!(t[0], Int | Uint | Double | Str) || s.d(0) => {
            ok!(F::ToInt, Int)
        }
        ("uint", false, 1) if matches!(t[0], Int | Uint | Double | Str) || s.d(0) => {
            ok!(F::ToUint, Uint)
        }
        ("double", false, 1) if matches!(t[0], Int | Uint | Double | Str) || s.d(0) => {
            ok!(F::ToDouble, Double)
        }
        ("string", false, 1)
            if matches!(t[0], Int | Uint | Double | Str | Bool | Bytes | Ip | Cidr) || s.d(0) =>
        {
            ok!(F::ToString, Str)
        }
        ("bool", false, 1) if matches!(t[0], Bool | Str) || s.d(0) => ok!(F::ToBool, Bool),
        ("bytes", false, 1) if matches!(t[0], Bytes | Str) || s.d(0) => ok!(F::ToBytes, Bytes),
        ("type", false, 1) => ok!(F::TypeOf, Type),
        ("dyn", false, 1) => ok!(F::Dyn, Dyn),
        _ => None,
    }
}

pub(super) fn call(f: Func, a: &[Value]) -> EvalResult {
    use Value::*;
    match f {
        Func::ToInt => match &a[0] {
            Int(x) => Ok(Int(*x)),
            Uint(x) => i64::try_from(*x)
                .map(Int)
                .map_err(|_| "range error converting uint to int".into()),
            Double(x) => double_to_int(*x)
                .map(Int)
                .ok_or_else(|| "range error converting double to int".into()),
            Str(s) => s
                .parse::<i64>()
                .map(Int)
                .map_err(|_| format!("cannot convert '{s}' to int")),
            _ => no_overload(),
        },
        Func::ToUint => match &a[0] {
            Uint(x) => Ok(Uint(*x)),
            Int(x) => u64::try_from(*x)
                .map(Uint)
                .map_err(|_| "range error converting int to uint".into()),
            Double(x) => double_to_uint(*x)
                .map(Uint)
                .ok_or_else(|| "range error converting double to uint".into()),
            Str(s) => s
                .parse::<u64>()
                .map(Uint)
                .map_err(|_| format!("cannot convert '{s}' to uint")),
            _ => no_overload(),
        },
        Func::ToDouble => match &a[0] {
            Double(x) => Ok(Double(*x)),
            Int(x) => Ok(Double(*x as f64)),
            Uint(x) => Ok(Double(*x as f64)),
            Str(s) => s
                .parse::<f64>()
                .map(Double)
                .map_err(|_| format!("cannot convert '{s}' to double")),
            _ => no_overload(),
        },
        Func::ToString => match &a[0] {
            Str(s) => Ok(Str(s.clone())),
            Int(x) => Ok(Value::str(&x.to_string())),
            Uint(x) => Ok(Value::str(&x.to_string())),
            Double(x) => Ok(Value::str(&fmt_double(*x))),
            Bool(x) => Ok(Value::str(if *x { "true" } else { "false" })),
            Bytes(x) => std::str::from_utf8(x)
                .map(Value::str)
                .map_err(|_| BYTES_NOT_UTF8.into()),
            Ip(x) => Ok(Value::str(&x.to_string())),
            Cidr(p) => Ok(Value::str(&p.to_string())),
            _ => no_overload(),
        },
        Func::ToBytes => match &a[0] {
            Bytes(x) => Ok(Bytes(x.clone())),
            Str(s) => Ok(Bytes(std::sync::Arc::from(s.as_bytes()))),
            _ => no_overload(),
        },
        Func::ToBool => match &a[0] {
            Bool(x) => b(*x),
            Str(s) => match s.as_ref() {
                "1" | "t" | "T" | "true" | "TRUE" | "True" => b(true),
                "0" | "f" | "F" | "false" | "FALSE" | "False" => b(false),
                _ => Err("type conversion error from 'string' to 'bool'".to_string()),
            },
            _ => no_overload(),
        },
        Func::TypeOf => Ok(Type(a[0].type_name())),
        Func::Dyn => Ok(a[0].clone()),
        _ => no_overload(),
    }
}

fn fmt_double(x: f64) -> String {
    if x.is_finite() && x == x.trunc() && x.abs() < 1e21 {
        format!("{x:.0}")
    } else {
        format!("{x}")
    }
}
