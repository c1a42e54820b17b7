//! The Kubernetes IP and CIDR libraries: `ip`, `isIP`, `ip.isCanonical`, `cidr`, `isCIDR` and the
//! member functions of `net.IP` and `net.CIDR`. A call already costs 1; parsing costs what
//! upstream's `CostEstimator.CallCost` charges instead (a tenth per character, rounded up) when that
//! is more. The value types are `value::net`.
use super::overload::{Resolved, Sig};
use super::price::{k8s_size, size, tenths};
use crate::cel::func::Func;
use crate::cel::types::Ty;
use crate::cel::value::net::{Addr, Prefix};
use crate::cel::value::{EvalResult, Value, b, no_overload};
use std::sync::Arc;

/// The names this library declares (a call with other arguments finds no overload).
pub(super) const NAMES: &[&str] = &[
    "ip",
    "isIP",
    "ip.isCanonical",
    "family",
    "isUnspecified",
    "isLoopback",
    "isLinkLocalMulticast",
    "isLinkLocalUnicast",
    "isGlobalUnicast",
    "cidr",
    "isCIDR",
    "containsIP",
    "containsCIDR",
    "masked",
    "prefixLength",
];

pub(super) fn resolve(s: &Sig) -> Option<Resolved> {
    use Func as F;
    use Ty::*;
    let (name, t, n) = (s.name, s.t, s.t.len());
    match (name, s.member, n) {
        ("ip", false, 1) if s.is(0, &Str) => ok!(F::Ip, Ip),
        ("isIP", false, 1) if s.is(0, &Str) => ok!(F::IsIp, Bool),
        ("ip.isCanonical", false, 1) if s.is(0, &Str) => ok!(F::IpIsCanonical, Bool),
        ("family", true, 1) if s.is(0, &Ip) => ok!(F::IpFamily, Int),
        (
            "isUnspecified"
            | "isLoopback"
            | "isLinkLocalMulticast"
            | "isLinkLocalUnicast"
            | "isGlobalUnicast",
            true,
            1,
        ) if s.is(0, &Ip) => ok!(
            match name {
                "isUnspecified" => F::IpIsUnspecified,
                "isLoopback" => F::IpIsLoopback,
                "isLinkLocalMulticast" => F::IpIsLinkLocalMulticast,
                "isLinkLocalUnicast" => F::IpIsLinkLocalUnicast,
                _ => F::IpIsGlobalUnicast,
            },
            Bool
        ),
        ("cidr", false, 1) if s.is(0, &Str) => ok!(F::Cidr, Cidr),
        ("isCIDR", false, 1) if s.is(0, &Str) => ok!(F::IsCidr, Bool),
        ("containsIP", true, 2) if s.is(0, &Cidr) && (s.is(1, &Str) || t[1] == Ip) => {
            ok!(F::CidrContainsIp, Bool)
        }
        ("containsCIDR", true, 2) if s.is(0, &Cidr) && (s.is(1, &Str) || t[1] == Cidr) => {
            ok!(F::CidrContainsCidr, Bool)
        }
        ("ip", true, 1) if s.is(0, &Cidr) => ok!(F::CidrIp, Ip),
        ("masked", true, 1) if s.is(0, &Cidr) => ok!(F::CidrMasked, Cidr),
        ("prefixLength", true, 1) if s.is(0, &Cidr) => ok!(F::CidrPrefixLength, Int),
        _ => None,
    }
}

pub(super) fn call(f: Func, a: &[Value]) -> EvalResult {
    use Value::*;
    let str_arg = |i: usize| match a.get(i) {
        Some(Str(s)) => Ok(s.clone()),
        _ => no_overload(),
    };
    match f {
        Func::Ip | Func::IsIp | Func::IpIsCanonical => {
            let s = str_arg(0)?;
            let r = Addr::parse(&s);
            match f {
                Func::Ip => r.map(|x| Ip(Arc::new(x))),
                Func::IsIp => b(r.is_ok()),
                _ => b(r?.to_string() == *s),
            }
        }
        Func::Cidr | Func::IsCidr => {
            let s = str_arg(0)?;
            let r = Prefix::parse(&s);
            if f == Func::IsCidr {
                return b(r.is_ok());
            }
            r.map(|x| Cidr(Arc::new(x)))
        }
        Func::IpFamily
        | Func::IpIsUnspecified
        | Func::IpIsLoopback
        | Func::IpIsLinkLocalMulticast
        | Func::IpIsLinkLocalUnicast
        | Func::IpIsGlobalUnicast => {
            let Ip(x) = &a[0] else { return no_overload() };
            match f {
                Func::IpFamily => Ok(Int(x.family())),
                Func::IpIsUnspecified => b(x.is_unspecified()),
                Func::IpIsLoopback => b(x.is_loopback()),
                Func::IpIsLinkLocalMulticast => b(x.is_link_local_multicast()),
                Func::IpIsLinkLocalUnicast => b(x.is_link_local_unicast()),
                _ => b(x.is_global_unicast()),
            }
        }
        Func::CidrContainsIp | Func::CidrContainsCidr => {
            let Cidr(p) = &a[0] else { return no_overload() };
            match (f, &a[1]) {
                (Func::CidrContainsIp, Ip(x)) => b(p.contains_ip(x)),
                // upstream drops the parse error here (it reaches a type check first)
                (Func::CidrContainsIp, Str(s)) => match Addr::parse(s) {
                    Ok(x) => b(p.contains_ip(&x)),
                    Err(_) => no_overload(),
                },
                (Func::CidrContainsCidr, Cidr(o)) => b(p.contains_prefix(o)),
                (Func::CidrContainsCidr, Str(s)) => b(p.contains_prefix(&Prefix::parse(s)?)),
                _ => no_overload(),
            }
        }
        Func::CidrIp | Func::CidrMasked | Func::CidrPrefixLength => {
            let Cidr(p) = &a[0] else { return no_overload() };
            match f {
                Func::CidrIp => Ok(Ip(Arc::new(p.addr))),
                Func::CidrMasked => Ok(Cidr(Arc::new(p.masked()))),
                _ => Ok(Int(i64::from(p.bits))),
            }
        }
        _ => no_overload(),
    }
}

pub(super) fn cost(f: Func, a: &[Value]) -> u64 {
    use Value::*;
    let sz = |i: usize| a.get(i).map(size).unwrap_or(1);
    let k8s_sz = |i: usize| a.get(i).map(k8s_size).unwrap_or(1);
    match f {
        Func::IpIsCanonical => tenths(k8s_sz(0), 2),
        Func::CidrContainsIp | Func::CidrContainsCidr => {
            let cidr = match &a[0] {
                Cidr(p) => p.byte_len(),
                _ => 1,
            };
            let mut cost = tenths(2 * cidr, 1);
            if f == Func::CidrContainsCidr {
                cost += tenths(cidr, 1) + 1;
            }
            if let Some(Str(_)) = a.get(1) {
                cost += tenths(sz(1), 1);
            }
            cost
        }
        Func::Ip | Func::IsIp | Func::Cidr | Func::IsCidr => tenths(k8s_sz(0), 1),
        _ => 1,
    }
}
