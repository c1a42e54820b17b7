//! Static types for the checker: enough of cel-go's checker to give the same compile errors as the
//! scheduler for DRA selectors (undeclared references, no matching overload, non-bool results,
//! heterogeneous aggregate literals).
use std::fmt;

#[derive(Clone, Debug, PartialEq)]
pub enum Ty {
    Dyn,
    /// `google.protobuf.Any`: the declared type of attribute values; behaves like dyn but is the
    /// only non-bool result type a selector may have.
    Any,
    Bool,
    Int,
    Uint,
    Double,
    Str,
    Bytes,
    Null,
    List(Box<Ty>),
    Map(Box<Ty>, Box<Ty>),
    Quantity,
    Semver,
    Ip,
    Cidr,
    Url,
    /// `kubernetes.NamedFormat` (the format library)
    Format,
    Opt(Box<Ty>),
    Type,
    Device,
    /// The authz library's types (`kubernetes.authorization.*`). The DRA environment declares
    /// the library but no `authorizer` variable, so no value of these types ever exists; they
    /// only decide what type-checks.
    Authz(&'static str),
}

impl Ty {
    pub fn is_dyn(&self) -> bool {
        matches!(self, Ty::Dyn | Ty::Any)
    }
    pub fn list(t: Ty) -> Ty {
        Ty::List(Box::new(t))
    }
    pub fn map(k: Ty, v: Ty) -> Ty {
        Ty::Map(Box::new(k), Box::new(v))
    }
    pub fn opt(t: Ty) -> Ty {
        Ty::Opt(Box::new(t))
    }
    /// Whether a value of type `actual` may be passed where `self` is expected.
    pub fn accepts(&self, actual: &Ty) -> bool {
        if self.is_dyn() || actual.is_dyn() {
            return true;
        }
        match (self, actual) {
            (Ty::List(a), Ty::List(b)) => a.accepts(b),
            (Ty::Map(ak, av), Ty::Map(bk, bv)) => ak.accepts(bk) && av.accepts(bv),
            (Ty::Opt(a), Ty::Opt(b)) => a.accepts(b),
            (a, b) => a == b,
        }
    }
    /// The join of two types bound to the same type parameter, if they unify.
    pub fn unify(&self, o: &Ty) -> Option<Ty> {
        if self == o {
            return Some(self.clone());
        }
        if self.is_dyn() || o.is_dyn() {
            return Some(Ty::Dyn);
        }
        match (self, o) {
            (Ty::List(a), Ty::List(b)) => Some(Ty::list(a.unify(b)?)),
            (Ty::Map(ak, av), Ty::Map(bk, bv)) => Some(Ty::map(ak.unify(bk)?, av.unify(bv)?)),
            (Ty::Opt(a), Ty::Opt(b)) => Some(Ty::opt(a.unify(b)?)),
            _ => None,
        }
    }
    pub fn is_num(&self) -> bool {
        matches!(self, Ty::Int | Ty::Uint | Ty::Double)
    }
    pub fn elem(&self) -> Ty {
        match self {
            Ty::List(e) => (**e).clone(),
            Ty::Any => Ty::Any,
            _ => Ty::Dyn,
        }
    }
}

impl fmt::Display for Ty {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Ty::Dyn => f.write_str("dyn"),
            Ty::Any => f.write_str("google.protobuf.Any"),
            Ty::Bool => f.write_str("bool"),
            Ty::Int => f.write_str("int"),
            Ty::Uint => f.write_str("uint"),
            Ty::Double => f.write_str("double"),
            Ty::Str => f.write_str("string"),
            Ty::Bytes => f.write_str("bytes"),
            Ty::Null => f.write_str("null_type"),
            Ty::List(e) => write!(f, "list({e})"),
            Ty::Map(k, v) => write!(f, "map({k}, {v})"),
            Ty::Quantity => f.write_str("kubernetes.Quantity"),
            Ty::Semver => f.write_str("kubernetes.Semver"),
            Ty::Ip => f.write_str("net.IP"),
            Ty::Cidr => f.write_str("net.CIDR"),
            Ty::Url => f.write_str("kubernetes.URL"),
            Ty::Format => f.write_str("kubernetes.NamedFormat"),
            Ty::Opt(e) => write!(f, "optional_type({e})"),
            Ty::Type => f.write_str("type"),
            Ty::Device => f.write_str("kubernetes.DRADevice"),
            Ty::Authz(name) => write!(f, "kubernetes.authorization.{name}"),
        }
    }
}
