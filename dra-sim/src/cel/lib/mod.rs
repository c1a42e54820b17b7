//! The function libraries of the DRA CEL environment, one module each, holding everything about
//! their functions: the names they declare, overload resolution (`resolve`), evaluation (`call`)
//! and the runtime price (`cost`). This module chains the resolvers in cel-go's order, dispatches
//! calls and prices to the library of the function, and holds the pricing helpers they share.
//!
//! Functions whose name two libraries declare: `indexOf` and `lastIndexOf` (ext.Strings
//! on strings, ext.Lists on lists) and the comparisons `isGreaterThan`, `isLessThan`, `compareTo`
//! (quantity and semver) are dispatched by the receiver's value.
use super::func::Func;
use super::types::Ty;
use super::value::{EvalResult, Value};
use overload::{Resolved, Sig};

/// A resolver's answer for its own overload: `return` it from `resolve`.
macro_rules! ok {
    ($f:expr, $r:expr) => {
        return Some(Ok(($f, $r)))
    };
}

mod authz;
mod conversions;
pub mod format;
mod lists;
mod named_format;
mod net;
mod optional;
mod overload;
mod price;
mod quantity;
pub(crate) mod regex;
mod semver;
mod sets;
pub(crate) mod stdlib;
mod strings;
mod url;

/// Overload resolution: the function and result type of a call by `name` with these argument
/// types. Each library answers for the names it declares; a name none declares is undeclared.
pub fn resolve(name: &str, member: bool, t: &[Ty]) -> Resolved {
    let s = Sig { name, member, t };
    authz::resolve_member(&s)
        .or_else(|| stdlib::resolve(&s))
        .or_else(|| regex::resolve(&s))
        .or_else(|| conversions::resolve(&s))
        .or_else(|| quantity::resolve(&s))
        .or_else(|| semver::resolve(&s))
        .or_else(|| net::resolve(&s))
        .or_else(|| url::resolve(&s))
        .or_else(|| named_format::resolve(&s))
        .or_else(|| authz::resolve(&s))
        // before lists: `indexOf` on a `dyn` receiver with a string argument is the strings one
        .or_else(|| strings::resolve(&s))
        .or_else(|| format::resolve(&s))
        .or_else(|| lists::resolve(&s))
        .or_else(|| sets::resolve(&s))
        .or_else(|| optional::resolve(&s))
        .unwrap_or_else(|| {
            if known_function(name) {
                Err(None)
            } else {
                Err(Some(format!(
                    "undeclared reference to '{name}' (in container '')"
                )))
            }
        })
}

/// Whether some library declares a function of this name (with other argument types).
pub fn known_function(name: &str) -> bool {
    [
        stdlib::NAMES,
        regex::NAMES,
        conversions::NAMES,
        quantity::NAMES,
        semver::NAMES,
        net::NAMES,
        url::NAMES,
        named_format::NAMES,
        authz::NAMES,
        strings::NAMES,
        format::NAMES,
        lists::NAMES,
        sets::NAMES,
        optional::NAMES,
    ]
    .iter()
    .any(|names| names.contains(&name))
        || authz::member(name).is_some()
        || super::value::named_format::function_index(name).is_some()
}

/// The library whose module evaluates and prices a call of `f` with these arguments.
#[derive(Clone, Copy)]
enum Library {
    Core,
    Conversions,
    Regex,
    Strings,
    Format,
    Lists,
    Sets,
    Optional,
    Quantity,
    Semver,
    Net,
    Url,
    NamedFormat,
    Authz,
}

// A table from function to library (one arm per library), not logic to split.
fn library(f: Func, a: &[Value]) -> Library {
    use Func as F;
    use Library as L;
    match f {
        F::Add
        | F::Sub
        | F::Mul
        | F::Div
        | F::Mod
        | F::Neg
        | F::Not
        | F::Eq
        | F::Ne
        | F::Lt
        | F::Le
        | F::Gt
        | F::Ge
        | F::In
        | F::Index
        | F::OptIndex
        | F::NotStrictlyFalse
        | F::Size
        | F::Contains
        | F::StartsWith
        | F::EndsWith
        | F::MapInsert
        | F::MapMerge => L::Core,
        F::ToInt
        | F::ToUint
        | F::ToDouble
        | F::ToString
        | F::ToBool
        | F::ToBytes
        | F::TypeOf
        | F::Dyn => L::Conversions,
        F::Matches | F::Find | F::FindAll => L::Regex,
        F::Reverse => L::Lists,
        F::IndexOf | F::LastIndexOf => match a.first() {
            Some(Value::List(_)) => L::Lists,
            _ => L::Strings,
        },
        F::CharAt
        | F::LowerAscii
        | F::UpperAscii
        | F::Replace
        | F::Split
        | F::Substring
        | F::Trim
        | F::Join
        | F::Quote => L::Strings,
        F::Format => L::Format,
        F::IsSorted
        | F::Sum
        | F::Min
        | F::Max
        | F::Slice
        | F::Flatten
        | F::Distinct
        | F::ListsRange
        | F::First
        | F::Last
        | F::Sort
        | F::SortDyn
        | F::SortByKeys
        | F::SortByKeysDyn
        | F::Includes => L::Lists,
        F::SetsContains | F::SetsEquivalent | F::SetsIntersects => L::Sets,
        F::OptionalOf
        | F::OptionalNone
        | F::OptionalOfNonZero
        | F::HasValue
        | F::OptValue
        | F::OrValue
        | F::Or => L::Optional,
        F::IsGreaterThan | F::IsLessThan | F::CompareTo => match a.first() {
            Some(Value::Semver(_)) => L::Semver,
            _ => L::Quantity,
        },
        F::Quantity
        | F::IsQuantity
        | F::QIsInteger
        | F::QAsInteger
        | F::QAsApproximateFloat
        | F::QSign
        | F::QAdd
        | F::QSub => L::Quantity,
        F::Semver | F::IsSemver | F::Major | F::Minor | F::Patch => L::Semver,
        F::Ip
        | F::IsIp
        | F::IpIsCanonical
        | F::IpFamily
        | F::IpIsUnspecified
        | F::IpIsLoopback
        | F::IpIsLinkLocalMulticast
        | F::IpIsLinkLocalUnicast
        | F::IpIsGlobalUnicast
        | F::Cidr
        | F::IsCidr
        | F::CidrContainsIp
        | F::CidrContainsCidr
        | F::CidrIp
        | F::CidrMasked
        | F::CidrPrefixLength => L::Net,
        F::Url
        | F::IsUrl
        | F::UrlScheme
        | F::UrlHost
        | F::UrlHostname
        | F::UrlPort
        | F::UrlEscapedPath
        | F::UrlQuery => L::Url,
        F::FormatNamed | F::FormatOf(_) | F::FormatValidate => L::NamedFormat,
        F::Authz(_) => L::Authz,
    }
}

/// Evaluates a call of `f` on argument values `a` (the receiver first).
pub(crate) fn call(f: Func, a: &[Value]) -> EvalResult {
    match library(f, a) {
        Library::Core => stdlib::call(f, a),
        Library::Conversions => conversions::call(f, a),
        Library::Regex => regex::call(f, a),
        Library::Strings => strings::call(f, a),
        Library::Format => format::call(f, a),
        Library::Lists => lists::call(f, a),
        Library::Sets => sets::call(f, a),
        Library::Optional => optional::call(f, a),
        Library::Quantity => quantity::call(f, a),
        Library::Semver => semver::call(f, a),
        Library::Net => net::call(f, a),
        Library::Url => url::call(f, a),
        Library::NamedFormat => named_format::call(f, a),
        Library::Authz => authz::call(f, a),
    }
}

/// What cel-go's cost tracker charges for a call with these arguments and result (a failed
/// argument or result passed as `Null`): the Kubernetes library estimator's price where it has
/// one, then ext.Lists' and ext.Sets' trackers, then cel-go's own, else 1. A regex call with a
/// literal pattern (`Node::RegexCall`) is priced where it runs.
pub(crate) fn cost(f: Func, a: &[Value], result: &Value) -> u64 {
    match library(f, a) {
        Library::Core => stdlib::cost(f, a),
        Library::Conversions | Library::Optional => 1,
        Library::Quantity => quantity::cost(f, a),
        Library::Semver => semver::cost(f, a),
        Library::Regex => regex::cost(f, a),
        Library::Strings => strings::cost(f, a, result),
        Library::Format => format::cost(f, a),
        Library::Lists => lists::cost(f, a, result),
        Library::Sets => sets::cost(f, a),
        Library::Net => net::cost(f, a),
        Library::Url => url::cost(f, a),
        Library::NamedFormat => named_format::cost(f, a),
        Library::Authz => authz::cost(f, a),
    }
}
