//! The Kubernetes quantity library: `quantity`, `isQuantity`, the member functions of
//! `kubernetes.Quantity`, and the comparisons it shares with semver (`isGreaterThan`, `isLessThan`,
//! `compareTo`). The value type is `value::quantity`.
use super::overload::{Resolved, Sig};
use super::price::{k8s_size, tenths};
use crate::cel::func::Func;
use crate::cel::types::Ty;
use crate::cel::value::{EvalResult, Value, b, no_overload, quantity};
use std::cmp::Ordering;

/// The names this library declares (a call with other arguments finds no overload).
pub(super) const NAMES: &[&str] = &[
    "quantity",
    "isQuantity",
    "isInteger",
    "asInteger",
    "asApproximateFloat",
    "sign",
    "add",
    "sub",
    "isGreaterThan",
    "isLessThan",
    "compareTo",
];

pub(super) fn resolve(s: &Sig) -> Option<Resolved> {
    use Func as F;
    use Ty::*;
    let (name, t, n) = (s.name, s.t, s.t.len());
    match (name, s.member, n) {
        ("quantity", false, 1) if s.is(0, &Str) => ok!(F::Quantity, Quantity),
        ("isQuantity", false, 1) if s.is(0, &Str) => ok!(F::IsQuantity, Bool),
        ("isInteger", true, 1) if s.is(0, &Quantity) => ok!(F::QIsInteger, Bool),
        ("asInteger", true, 1) if s.is(0, &Quantity) => ok!(F::QAsInteger, Int),
        ("asApproximateFloat", true, 1) if s.is(0, &Quantity) => {
            ok!(F::QAsApproximateFloat, Double)
        }
        ("sign", false, 1) if s.is(0, &Quantity) => ok!(F::QSign, Int),
        ("add" | "sub", true, 2) if s.is(0, &Quantity) && (s.is(1, &Quantity) || t[1] == Int) => {
            ok!(if name == "add" { F::QAdd } else { F::QSub }, Quantity)
        }
        ("isGreaterThan" | "isLessThan" | "compareTo", true, 2)
            if s.is(0, &Quantity) && s.is(1, &Quantity) =>
        {
            match name {
                "isGreaterThan" => ok!(F::IsGreaterThan, Bool),
                "isLessThan" => ok!(F::IsLessThan, Bool),
                _ => ok!(F::CompareTo, Int),
            }
        }
        _ => None,
    }
}

pub(super) fn call(f: Func, a: &[Value]) -> EvalResult {
    use Value::*;
    match f {
        Func::Quantity => match &a[0] {
            Str(s) => quantity::Quantity::parse(s).map(Quantity),
            _ => no_overload(),
        },
        Func::IsQuantity => match &a[0] {
            Str(s) => b(quantity::Quantity::parse(s).is_ok()),
            _ => no_overload(),
        },
        Func::QIsInteger => match &a[0] {
            Quantity(q) => b(q.as_i64().is_some()),
            _ => no_overload(),
        },
        Func::QAsInteger => match &a[0] {
            Quantity(q) => q
                .as_i64()
                .map(Int)
                .ok_or_else(|| "cannot convert value to integer".into()),
            _ => no_overload(),
        },
        Func::QAsApproximateFloat => match &a[0] {
            Quantity(q) => Ok(Double(q.as_f64())),
            _ => no_overload(),
        },
        Func::QSign => match &a[0] {
            Quantity(q) => Ok(Int(q.sign())),
            _ => no_overload(),
        },
        Func::QAdd | Func::QSub => {
            let Quantity(q) = &a[0] else {
                return no_overload();
            };
            let o = match &a[1] {
                Quantity(o) => *o,
                Int(i) => quantity::Quantity::from_i64(*i),
                _ => return no_overload(),
            };
            let r = if f == Func::QAdd {
                q.add(&o)?
            } else {
                q.sub(&o)?
            };
            Ok(Quantity(r.by_pointer()))
        }
        Func::IsGreaterThan | Func::IsLessThan | Func::CompareTo => {
            let (Quantity(x), Quantity(y)) = (&a[0], &a[1]) else {
                return no_overload();
            };
            Ok(ordering(f, x.cmp_q(y)))
        }
        _ => no_overload(),
    }
}

pub(super) fn cost(f: Func, a: &[Value]) -> u64 {
    let k8s_sz = |i: usize| a.get(i).map(k8s_size).unwrap_or(1);
    match f {
        Func::Quantity | Func::IsQuantity => tenths(k8s_sz(0), 1),
        _ => 1,
    }
}

/// `isGreaterThan`, `isLessThan` or `compareTo`'s answer for an ordering (semver's too).
pub(super) fn ordering(f: Func, o: Ordering) -> Value {
    match f {
        Func::IsGreaterThan => Value::Bool(o == Ordering::Greater),
        Func::IsLessThan => Value::Bool(o == Ordering::Less),
        _ => Value::Int(o as i64),
    }
}
