//! Optional types: `optional.of`, `optional.ofNonZeroValue`, `optional.none`, `hasValue`, `value`,
//! `orValue`, `or` (the evaluator short-cuts `or` and `orValue`: their right side runs only when
//! needed).
use super::overload::{Resolved, Sig};
use crate::cel::func::Func;
use crate::cel::types::Ty;
use crate::cel::value::{EvalResult, Value, b, no_overload};
use std::sync::Arc;

/// The names this library declares (a call with other arguments finds no overload).
pub(super) const NAMES: &[&str] = &[
    "optional.of",
    "optional.ofNonZeroValue",
    "optional.none",
    "hasValue",
    "value",
    "orValue",
    "or",
];

pub(super) fn resolve(s: &Sig) -> Option<Resolved> {
    use Func as F;
    use Ty::*;
    let (name, t, n) = (s.name, s.t, s.t.len());
    match (name, s.member, n) {
        ("optional.of", false, 1) => ok!(F::OptionalOf, Ty::opt(t[0].clone())),
        ("optional.ofNonZeroValue", false, 1) => ok!(F::OptionalOfNonZero, Ty::opt(t[0].clone())),
        ("optional.none", false, 0) => ok!(F::OptionalNone, Ty::opt(Ty::Free)),
        ("hasValue", true, 1) if matches!(t[0], Opt(_)) || s.d(0) => ok!(F::HasValue, Bool),
        ("value", true, 1) if matches!(t[0], Opt(_)) || s.d(0) => {
            ok!(F::OptValue, inner_opt(&t[0]))
        }
        ("orValue", true, 2) if matches!(t[0], Opt(_)) || s.d(0) => {
            let it = inner_opt(&t[0]);
            let Some(u) = it.bind(&t[1]) else {
                return Some(Err(None));
            };
            ok!(F::OrValue, u)
        }
        ("or", true, 2)
            if (matches!(t[0], Opt(_)) || s.d(0)) && (matches!(t[1], Opt(_)) || s.d(1)) =>
        {
            let Some(u) = t[0].bind(&t[1]) else {
                return Some(Err(None));
            };
            ok!(F::Or, u)
        }
        _ => None,
    }
}

pub(super) fn call(f: Func, a: &[Value]) -> EvalResult {
    use Value::*;
    match f {
        Func::OptionalOf => Ok(Optional(Some(Arc::new(a[0].clone())))),
        Func::OptionalNone => Ok(Optional(None)),
        Func::OptionalOfNonZero => {
            let zero = match &a[0] {
                Null => true,
                Bool(x) => !x,
                Int(x) => *x == 0,
                Uint(x) => *x == 0,
                Double(x) => *x == 0.0,
                Str(s) => s.is_empty(),
                Bytes(x) => x.is_empty(),
                List(l) => l.is_empty(),
                Map(m) => m.entries.is_empty(),
                _ => false,
            };
            Ok(Optional(if zero {
                None
            } else {
                Some(Arc::new(a[0].clone()))
            }))
        }
        Func::HasValue => match &a[0] {
            Optional(o) => b(o.is_some()),
            _ => no_overload(),
        },
        Func::OptValue => match &a[0] {
            Optional(Some(v)) => Ok((**v).clone()),
            Optional(None) => Err("optional.none() dereference".into()),
            _ => no_overload(),
        },
        Func::OrValue => match &a[0] {
            Optional(Some(v)) => Ok((**v).clone()),
            Optional(None) => Ok(a[1].clone()),
            _ => no_overload(),
        },
        Func::Or => match &a[0] {
            Optional(Some(_)) => Ok(a[0].clone()),
            Optional(None) => Ok(a[1].clone()),
            _ => no_overload(),
        },
        _ => no_overload(),
    }
}

fn inner_opt(t: &Ty) -> Ty {
    match t {
        Ty::Opt(i) => (**i).clone(),
        _ => Ty::Dyn,
    }
}
