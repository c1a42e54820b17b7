//! The Kubernetes authz library (`kubernetes.authorization.*` types and their member functions).
//! The DRA environment has no `authorizer` variable, so no value of these types exists: calls only
//! type-check through `dyn`, and fail with `no such overload` when run, priced all the same.
use super::overload::{Resolved, Sig};
use super::price::{k8s_size, tenths};
use crate::cel::func::{AuthzPrice, Func};
use crate::cel::types::Ty;
use crate::cel::value::{EvalResult, Value, no_overload};

/// The names this library declares (a call with other arguments finds no overload); the member
/// functions of [`member`] too.
pub(super) const NAMES: &[&str] = &["check"];

/// The member functions but `check`, looked up before any other library: a member call by one of
/// these names is the authz library's, whatever its receiver.
pub(super) fn resolve_member(s: &Sig) -> Option<Resolved> {
    if !s.member {
        return None;
    }
    let (receiver, arity, result) = member(s.name)?;
    let n = s.t.len();
    if s.is(0, &Ty::Authz(receiver)) && n == arity + 1 && (1..n).all(|i| s.is(i, &Ty::Str)) {
        return Some(Ok((Func::Authz(AuthzPrice::of(s.name)), result)));
    }
    Some(Err(None))
}

/// The authz library's member functions but `check` (the only one with two receivers), with the
/// field and label selectors: receiver, number of arguments (all strings) and result.
pub(super) fn member(name: &str) -> Option<(&'static str, usize, Ty)> {
    let a = Ty::Authz;
    Some(match name {
        "path" => ("Authorizer", 1, a("PathCheck")),
        "group" => ("Authorizer", 1, a("GroupCheck")),
        "serviceAccount" => ("Authorizer", 2, a("Authorizer")),
        "resource" => ("GroupCheck", 1, a("ResourceCheck")),
        "subresource" | "namespace" | "name" | "fieldSelector" | "labelSelector" => {
            ("ResourceCheck", 1, a("ResourceCheck"))
        }
        "allowed" | "errored" => ("Decision", 0, Ty::Bool),
        "reason" | "error" => ("Decision", 0, Ty::Str),
        _ => return None,
    })
}

pub(super) fn resolve(s: &Sig) -> Option<Resolved> {
    use Func as F;
    use Ty::*;
    let (name, _t, n) = (s.name, s.t, s.t.len());
    match (name, s.member, n) {
        ("check", true, 2)
            if (s.is(0, &Authz("PathCheck")) || s.is(0, &Authz("ResourceCheck")))
                && s.is(1, &Str) =>
        {
            ok!(F::Authz(AuthzPrice::Check), Authz("Decision"))
        }
        _ => None,
    }
}

/// No value of an authz type exists (the environment has no `authorizer`): a call that
/// type-checked through a `dyn` receiver finds no overload, as in cel-go.
pub(super) fn call(_f: Func, _a: &[Value]) -> EvalResult {
    no_overload()
}

pub(super) fn cost(f: Func, a: &[Value]) -> u64 {
    let k8s_sz = |i: usize| a.get(i).map(k8s_size).unwrap_or(1);
    match f {
        Func::Authz(AuthzPrice::Check) => 350_000,
        // the estimator's selector price: a list (10), a tenth of the string, and per
        // requirement (one per two characters) a list and a struct (10 + 40), rounded up
        Func::Authz(AuthzPrice::Selector) if a.len() >= 2 => {
            let n = k8s_sz(1);
            10 + tenths(n, 1) + n.div_ceil(2) * 50
        }
        _ => 1,
    }
}
