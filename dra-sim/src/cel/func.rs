//! The functions a compiled program calls, grouped by the library that declares them: what
//! overload resolution (`lib::resolve`) picks and what the interpreter (`lib::call`) and the cost
//! counter (`lib::cost`) dispatch on.

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Func {
    // cel-go's standard library (operators, `size`, string tests, conversions, `type`, `dyn`)
    Add,
    Sub,
    Mul,
    Div,
    Mod,
    Neg,
    Not,
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
    In,
    Index,
    OptIndex,
    NotStrictlyFalse,
    Size,
    Contains,
    StartsWith,
    EndsWith,
    ToInt,
    ToUint,
    ToDouble,
    ToString,
    ToBool,
    ToBytes,
    TypeOf,
    Dyn,
    /// accumulator map + key + value (transformMap)
    MapInsert,
    /// accumulator map + map (transformMapEntry; duplicate keys are an error)
    MapMerge,
    // regular expressions: `matches` (standard) and the Kubernetes regex library
    Matches,
    Find,
    FindAll,
    // ext.Strings v2 (`indexOf`, `lastIndexOf` and `reverse` of lists are ext.Lists')
    CharAt,
    IndexOf,
    LastIndexOf,
    LowerAscii,
    UpperAscii,
    Replace,
    Split,
    Substring,
    Trim,
    Join,
    Reverse,
    Quote,
    Format,
    // ext.Lists v3 and the Kubernetes lists library
    IsSorted,
    Sum,
    Min,
    Max,
    Slice,
    Flatten,
    Distinct,
    ListsRange,
    First,
    Last,
    Sort,
    /// `sort()` that type-checked against several overloads (a `dyn` list): dispatched at run
    /// time, which cel-go's cost tracker knows no price for (1) and never looks into.
    SortDyn,
    /// list + its sort keys (the `sortBy` macro)
    SortByKeys,
    /// [`Func::SortByKeys`] with keys of a type known only at run time (as [`Func::SortDyn`])
    SortByKeysDyn,
    Includes,
    // ext.Sets
    SetsContains,
    SetsEquivalent,
    SetsIntersects,
    // optional types
    OptionalOf,
    OptionalNone,
    OptionalOfNonZero,
    HasValue,
    OptValue,
    OrValue,
    Or,
    // the Kubernetes quantity library (the comparisons are shared with semver)
    Quantity,
    IsQuantity,
    QIsInteger,
    QAsInteger,
    QAsApproximateFloat,
    QSign,
    QAdd,
    QSub,
    IsGreaterThan,
    IsLessThan,
    CompareTo,
    // the Kubernetes semver library
    Semver,
    IsSemver,
    Major,
    Minor,
    Patch,
    // the Kubernetes IP and CIDR libraries
    Ip,
    IsIp,
    IpIsCanonical,
    IpFamily,
    IpIsUnspecified,
    IpIsLoopback,
    IpIsLinkLocalMulticast,
    IpIsLinkLocalUnicast,
    IpIsGlobalUnicast,
    Cidr,
    IsCidr,
    CidrContainsIp,
    CidrContainsCidr,
    CidrIp,
    CidrMasked,
    CidrPrefixLength,
    // the Kubernetes URL library
    Url,
    IsUrl,
    UrlScheme,
    UrlHost,
    UrlHostname,
    UrlPort,
    UrlEscapedPath,
    UrlQuery,
    // the Kubernetes format library
    /// `format.named(string)`
    FormatNamed,
    /// `format.<name>()`: the named format at this index of `named_format::FORMATS`
    FormatOf(u8),
    /// `<format>.validate(string)`
    FormatValidate,
    /// any function of the authz library: only ever reached with a receiver of another type,
    /// but priced by the Kubernetes estimator all the same
    Authz(AuthzPrice),
}

/// What the Kubernetes cost estimator charges for an authz library call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AuthzPrice {
    /// `check`: 350,000
    Check,
    /// `fieldSelector` / `labelSelector`: by the selector string's length
    Selector,
    /// anything else: 1
    Unit,
}

impl AuthzPrice {
    pub(crate) fn of(name: &str) -> Self {
        match name {
            "check" => AuthzPrice::Check,
            "fieldSelector" | "labelSelector" => AuthzPrice::Selector,
            _ => AuthzPrice::Unit,
        }
    }
}
