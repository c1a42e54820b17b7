//! Static types for the checker: enough of cel-go's checker to give the same compile errors as the
//! scheduler for DRA selectors (undeclared references, no matching overload, non-bool results,
//! heterogeneous aggregate literals).
use std::fmt;

#[derive(Clone, Debug, PartialEq)]
pub enum Ty {
    Dyn,
    /// A type cel-go's checker leaves open: the element type of `[]`, the key and value types of
    /// `{}`. It fits anything like `dyn`, but where overloads differ by it (`[].sort()`), the
    /// first that takes it binds it, and so decides the result type.
    Free,
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
        matches!(self, Ty::Dyn | Ty::Any | Ty::Free)
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
        if *self == Ty::Null || *actual == Ty::Null {
            return self.nullable() && actual.nullable();
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
        match (self, o) {
            (Ty::Free, t) | (t, Ty::Free) => return Some(t.clone()),
            _ => {}
        }
        if self.is_dyn() || o.is_dyn() {
            return Some(Ty::Dyn);
        }
        match (self, o) {
            (Ty::Null, t) | (t, Ty::Null) if t.nullable() => return Some(t.clone()),
            _ => {}
        }
        match (self, o) {
            (Ty::List(a), Ty::List(b)) => Some(Ty::list(a.unify(b)?)),
            (Ty::Map(ak, av), Ty::Map(bk, bv)) => Some(Ty::map(ak.unify(bk)?, av.unify(bv)?)),
            (Ty::Opt(a), Ty::Opt(b)) => Some(Ty::opt(a.unify(b)?)),
            _ => None,
        }
    }
    /// `self` with its open parts ([`Ty::Free`]) taken from `o` where `o` has the same shape: what
    /// cel-go's type substitution makes of them once `o` was assigned.
    pub fn fill(&self, o: &Ty) -> Ty {
        match (self, o) {
            (Ty::Free, o) => o.clone(),
            (Ty::List(a), Ty::List(b)) => Ty::list(a.fill(b)),
            (Ty::Map(ak, av), Ty::Map(bk, bv)) => Ty::map(ak.fill(bk), av.fill(bv)),
            (Ty::Opt(a), Ty::Opt(b)) => Ty::opt(a.fill(b)),
            (s, _) => s.clone(),
        }
    }
    /// Whether some part of the type is still open ([`Ty::Free`]).
    pub fn is_open(&self) -> bool {
        match self {
            Ty::Free => true,
            Ty::List(e) | Ty::Opt(e) => e.is_open(),
            Ty::Map(k, v) => k.is_open() || v.is_open(),
            _ => false,
        }
    }
    /// cel-go's `isEqualOrLessSpecific`: whether `self` is as general as `o` or more (`dyn` is
    /// the most general), part by part.
    pub fn as_general(&self, o: &Ty) -> bool {
        if self.is_dyn() {
            return true;
        }
        if o.is_dyn() {
            return false;
        }
        match (self, o) {
            (Ty::List(a), Ty::List(b)) | (Ty::Opt(a), Ty::Opt(b)) => a.as_general(b),
            (Ty::Map(ak, av), Ty::Map(bk, bv)) => ak.as_general(bk) && av.as_general(bv),
            (a, b) => a == b,
        }
    }
    /// cel-go's `mostGeneral`: `self` if it is as general as `o`, else `o`.
    fn most_general(&self, o: &Ty) -> Ty {
        if self.as_general(o) {
            self.clone()
        } else {
            o.clone()
        }
    }
    /// What a type parameter that stands for `self` stands for once `next` is passed for it
    /// too (an overload's `(A, A)`, `?:`'s branches): `next` must fit, and the more general of
    /// the two wins, `next` on a tie (cel-go's `isValidTypeSubstitution`). Not symmetric:
    /// `c ? null : ip` is `null`, `c ? ip : null` is `net.IP`.
    pub fn bind(&self, next: &Ty) -> Option<Ty> {
        let (a, b) = (self.fill(next), next.fill(self));
        a.accepts(&b).then(|| b.most_general(&a))
    }
    /// A literal's element type so far joined with the next element's (cel-go's `joinTypes`):
    /// the more general, the earlier one on a tie; `None` when they do not fit.
    pub fn join(&self, next: &Ty) -> Option<Ty> {
        let (a, b) = (self.fill(next), next.fill(self));
        a.accepts(&b).then(|| a.most_general(&b))
    }
    /// cel-go's `IsExactType`, which the homogeneous-literal validator uses: no `dyn` wildcard
    /// (attribute values, declared `Any`, read as `dyn` there).
    pub fn exactly(&self, o: &Ty) -> bool {
        match (self, o) {
            (Ty::Free, _) | (_, Ty::Free) => true,
            (Ty::Any | Ty::Dyn, Ty::Any | Ty::Dyn) => true,
            // `optional.none()` is `optional_type(T)` with T still free in cel-go
            (Ty::Opt(a), Ty::Opt(b)) => a.is_dyn() || b.is_dyn() || a.exactly(b),
            (Ty::List(a), Ty::List(b)) => a.exactly(b),
            (Ty::Map(ak, av), Ty::Map(bk, bv)) => ak.exactly(bk) && av.exactly(bv),
            (a, b) => a == b,
        }
    }
    /// Whether `null` may stand for a value of this type in cel-go's checker: opaque and object
    /// types (not primitives, lists or maps).
    pub fn nullable(&self) -> bool {
        matches!(
            self,
            Ty::Null
                | Ty::Opt(_)
                | Ty::Quantity
                | Ty::Semver
                | Ty::Ip
                | Ty::Cidr
                | Ty::Url
                | Ty::Format
                | Ty::Authz(_)
                | Ty::Device
        ) || self.is_dyn()
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
            Ty::Dyn | Ty::Free => f.write_str("dyn"),
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
