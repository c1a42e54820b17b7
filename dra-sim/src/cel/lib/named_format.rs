//! The Kubernetes format library's functions: `format.named(string)`, `format.<name>()` and
//! `<format>.validate(string)`. The formats themselves (names, rules, messages) are
//! `value::named_format`.
use super::overload::{Resolved, Sig};
use super::price::{k8s_size, match_cost};
use crate::cel::func::Func;
use crate::cel::types::Ty;
use crate::cel::value::{EvalResult, Value, named_format, no_overload};
use std::sync::Arc;

/// The names this library declares (a call with other arguments finds no overload).
pub(super) const NAMES: &[&str] = &["format.named", "validate"];

pub(super) fn resolve(s: &Sig) -> Option<Resolved> {
    use Func as F;
    use Ty::*;
    let (name, _t, n) = (s.name, s.t, s.t.len());
    match (name, s.member, n) {
        ("format.named", false, 1) if s.is(0, &Str) => ok!(F::FormatNamed, Ty::opt(Format)),
        ("validate", true, 2) if s.is(0, &Format) && s.is(1, &Str) => {
            ok!(F::FormatValidate, Ty::opt(Ty::list(Str)))
        }
        (_, false, 0) if let Some(i) = named_format::function_index(name) => {
            ok!(F::FormatOf(i), Format)
        }
        _ => None,
    }
}

pub(super) fn call(f: Func, a: &[Value]) -> EvalResult {
    use Value::*;
    match f {
        Func::FormatNamed => match &a[0] {
            Str(s) => Ok(Optional(
                named_format::lookup(s).map(|f| Arc::new(Format(f))),
            )),
            _ => no_overload(),
        },
        Func::FormatOf(i) => Ok(Format(&named_format::FORMATS[usize::from(i)])),
        Func::FormatValidate => {
            let (Format(f), Str(s)) = (&a[0], &a[1]) else {
                return no_overload();
            };
            let errs = f.validate(s);
            Ok(Optional((!errs.is_empty()).then(|| {
                Arc::new(List(Arc::new(errs.iter().map(|m| Value::str(m)).collect())))
            })))
        }
        _ => no_overload(),
    }
}

pub(super) fn cost(f: Func, a: &[Value]) -> u64 {
    use Value::*;
    let k8s_sz = |i: usize| a.get(i).map(k8s_size).unwrap_or(1);
    match f {
        // priced by the format's longest regex even when the string failed
        Func::FormatValidate => match &a[0] {
            Format(fm) => match_cost(k8s_sz(1), fm.max_regex_size),
            _ => 1,
        },
        _ => 1,
    }
}
