//! The Kubernetes URL library: `url`, `isURL` and the member functions of `kubernetes.URL`. The
//! value type is `value::url`.
use super::overload::{Resolved, Sig};
use super::price::{k8s_size, tenths};
use crate::cel::func::Func;
use crate::cel::types::Ty;
use crate::cel::value::{EvalResult, MapVal, Value, b, no_overload, url};
use std::sync::Arc;

/// The names this library declares (a call with other arguments finds no overload).
pub(super) const NAMES: &[&str] = &[
    "url",
    "isURL",
    "getScheme",
    "getHost",
    "getHostname",
    "getPort",
    "getEscapedPath",
    "getQuery",
];

pub(super) fn resolve(s: &Sig) -> Option<Resolved> {
    use Func as F;
    use Ty::*;
    let (name, _t, n) = (s.name, s.t, s.t.len());
    match (name, s.member, n) {
        ("url", false, 1) if s.is(0, &Str) => ok!(F::Url, Url),
        ("isURL", false, 1) if s.is(0, &Str) => ok!(F::IsUrl, Bool),
        ("getScheme" | "getHost" | "getHostname" | "getPort" | "getEscapedPath", true, 1)
            if s.is(0, &Url) =>
        {
            ok!(
                match name {
                    "getScheme" => F::UrlScheme,
                    "getHost" => F::UrlHost,
                    "getHostname" => F::UrlHostname,
                    "getPort" => F::UrlPort,
                    _ => F::UrlEscapedPath,
                },
                Str
            )
        }
        ("getQuery", true, 1) if s.is(0, &Url) => ok!(F::UrlQuery, Ty::map(Str, Ty::list(Str))),
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
        Func::Url | Func::IsUrl => {
            let s = str_arg(0)?;
            if f == Func::IsUrl {
                return b(url::Url::is_request_uri(&s));
            }
            url::Url::parse(&s).map(|x| Url(Arc::new(x)))
        }
        Func::UrlScheme
        | Func::UrlHost
        | Func::UrlHostname
        | Func::UrlPort
        | Func::UrlEscapedPath
        | Func::UrlQuery => {
            let Url(u) = &a[0] else { return no_overload() };
            Ok(match f {
                Func::UrlScheme => Value::str(u.scheme()),
                Func::UrlHost => Value::str(u.host()),
                Func::UrlHostname => Value::str(u.hostname()),
                Func::UrlPort => Value::str(u.port()),
                Func::UrlEscapedPath => Value::str(&u.escaped_path()),
                _ => Map(Arc::new(MapVal::native(
                    u.query()
                        .into_iter()
                        .map(|(k, v)| {
                            let l = v.iter().map(|x| Value::str(x)).collect();
                            (Value::str(&k), List(Arc::new(l)))
                        })
                        .collect(),
                ))),
            })
        }
        _ => no_overload(),
    }
}

pub(super) fn cost(f: Func, a: &[Value]) -> u64 {
    let k8s_sz = |i: usize| a.get(i).map(k8s_size).unwrap_or(1);
    match f {
        Func::Url => tenths(k8s_sz(0), 1),
        _ => 1,
    }
}
