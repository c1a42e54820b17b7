//! The Kubernetes DRA CEL environment (`k8s.io/dynamic-resource-allocation/cel`), built on the `cel`
//! crate (0.15).
//!
//! What comes from the `cel` crate: the parser only — ANTLR grammar, macro expansion of `has`,
//! `all`, `exists`, `exists_one`, `map`, `filter`, optional syntax `.?`/`[?]`, source positions and
//! the `ERROR: <input>:L:C:` parse-error text (wrapped in `compile()`: `compilation failed: ` prefix
//! and cel-go's ` | ` caret-line indentation).
//!
//! Where we extend or wrap it (the crate has no static checker, no Kubernetes libraries and no cost
//! limits, and its interpreter cannot express the `device` object's defaulting maps):
//! - `types.rs` / `compile.rs`: a type checker with the DRA declarations (`device.driver`,
//!   `attributes` as `map(string, map(string, google.protobuf.Any))`, `capacity` as
//!   `map(string, map(string, kubernetes.Quantity))`, `allowMultipleAllocations`) and the library
//!   signatures, giving cel-go's compile errors (undeclared reference, no matching overload,
//!   heterogeneous literals, result must be bool or the unknown type) and regex-literal validation.
//!   Macros the crate's parser leaves as plain calls are expanded here into our comprehension
//!   nodes: two-variable comprehensions (`all/exists/existsOne(k, v, p)`), `transformList`,
//!   `transformMap`, `transformMapEntry` (with and without filter), the ext.Lists `sortBy` macro,
//!   and `cel.bind`.
//! - `eval.rs`: our own interpreter over the checked program (compiled once, cached by `Cache`),
//!   with cel-go's error-absorbing `&&`/`||`, heterogeneous equality, cross-type numeric
//!   comparison, optional types (presence tests on non-maps answer "absent" like cel-go),
//!   ext.Strings v2 (+ `strings.quote`, `format`), ext.Lists v3, Kubernetes lists library v1 (with
//!   `includes`, new in 1.37), ext.Sets, regex `find`/`findAll`, and a runtime cost counter with
//!   the 1,000,000 limit (`actual cost limit exceeded`) that counts as cel-go's cost tracker does
//!   with the Kubernetes estimator (`ActualCost`): identifiers and qualifiers 1 (presence tests
//!   and missed optional qualifiers nothing), constants and literals of constants nothing (built
//!   when planning), other list/map literals 10/30, calls by cel-go's, ext.Lists', ext.Sets' and
//!   the Kubernetes library's prices on the argument values, calls after a failed argument as
//!   cel-go still charges them, and the limit checked after each step, ending the evaluation.
//! - `quantity.rs`: Kubernetes quantity parsing/comparison/arithmetic and canonical formatting
//!   that keeps the parsed format (`10Gi` stays `10Gi`; `sign(q)` is a global function, as
//!   upstream); `semver.rs`: blang/semver rules and the library's normalize mode.
//! - `net.rs` / `url.rs`: the base environment's IP, CIDR and URL libraries (`ip`, `isIP`,
//!   `ip.isCanonical`, `cidr`, `isCIDR`, `url`, `isURL` and their member functions, the `net.IP`
//!   and `net.CIDR` type names), with Go's `net/netip` and `net/url` (`ParseRequestURI`, then
//!   `Parse`; Go 1.26 strict colons) rules for what parses and how it prints, and the cost
//!   estimator's charges for parsing.
//! - `named_format.rs`: the base environment's Kubernetes format library: `format.named(string)`
//!   (an optional `kubernetes.NamedFormat`), `format.<name>()` for the 13 named formats and
//!   `<format>.validate(string)` (none when valid, else the messages), with apimachinery's name,
//!   label-key and label-value rules (and its trailing-dash masking for the `...Prefix` formats),
//!   `net/url`'s `ParseRequestURI` for `uri` and kube-openapi's uuid, base64, date and date-time
//!   checks, their exact messages, and the estimator's regex-match price for `validate`. Its
//!   functions are looked up by full name before `format` is taken as an identifier, as in cel-go.
//! - `fuse.rs`: selectors read the attributes they name straight from the ResourceSlice device
//!   ([`RawDevice`]); the whole `device` value ([`device_value`]) is built only for other uses of
//!   `device`. [`device_check`] raises the conversion errors the whole value would, once per
//!   device (the allocator keeps the outcome in its `DeviceCache`).
//!
//! Checked against cel-go by `tests/sim_differential.rs` (random selectors over random devices,
//! through the Go oracle on k8s.io/dynamic-resource-allocation v0.37.2): results, error kinds and
//! the runtime cost of every evaluation cel-go reports one for.
//!
//! - `format.rs`: ext.Strings `"<format>".format([args])` as v2 has it (cel-go's first
//!   formatter: en_US `%f` grouping, `%e` with superscript exponents), with its compile-time
//!   check of literal calls and the exemption of its arguments from the homogeneous-literal rule.
//!
//! - `compile.rs` also declares the authz library (`kubernetes.authorization.*` types and their
//!   member functions). The DRA environment has no `authorizer` variable, so no value of these
//!   types exists: calls only type-check through `dyn`, and fail with `no such overload` when run.
//!
//! Not covered (documented differences): static cost estimation (the scheduler does not
//! estimate; only admission does); the wording of some runtime `no such overload` errors (cel-go
//! adds the function and argument types); compile errors carry no source snippet, only the first
//! of several is reported, and they point at the digits, not the sign, of a negative literal.
//! `format` quotes list members by Go's `%q` without Unicode tables: unassigned code points stay
//! unescaped, and refuses precisions above 2^20 (Go would allocate them). URL edge: a
//! percent-escape that decodes to bytes that are not UTF-8 is kept as U+FFFD (Go strings hold any
//! bytes), visible only in what the accessors return. Runtime costs of shapes the differential
//! never generates (`<` on two strings known only at run time, `indexOf`/`format` on a string with
//! a failing argument, an optional index by a computed key, a field of a whole ternary) follow
//! cel-go's rules as read from its source, unchecked.
pub mod compile;
pub mod eval;
pub mod format;
pub mod fuse;
pub mod named_format;
pub mod net;
pub mod quantity;
pub mod semver;
pub mod types;
pub mod url;
pub mod value;

use k8s_openapi::api::resource::v1::{DeviceAttribute, DeviceCapacity};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
pub use value::Value;

/// Kubernetes' `CELSelectorExpressionMaxLength`.
pub const MAX_EXPRESSION_LENGTH: usize = 10 * 1024;

#[derive(Debug)]
pub struct Program {
    node: compile::Node,
    slots: usize,
}

/// Compiles a selector as the scheduler's cache does. Errors read like Kubernetes':
/// `compilation failed: ERROR: <input>:1:3: ...`, or `must evaluate to bool ...`.
pub fn compile(expr: &str) -> Result<Program, String> {
    let parser = cel::parser::Parser::new().enable_optional_syntax(true);
    let (ast, info) = parser.parse_with_source_info(expr).map_err(|e| {
        format!(
            "compilation failed: {}",
            e.to_string().replace("\n| ", "\n | ")
        )
    })?;
    let mut c = compile::Compiler::new(&info, expr);
    let (node, ty) = c
        .compile(&ast)
        .map_err(|e| format!("compilation failed: {e}"))?;
    c.validated()
        .map_err(|e| format!("compilation failed: {e}"))?;
    if !(ty == types::Ty::Bool || ty.is_dyn()) {
        return Err(format!(
            "must evaluate to bool or the unknown type, not {ty}"
        ));
    }
    Ok(Program {
        node: fuse::fuse(node),
        slots: c.max_slots,
    })
}

/// [`compile`] without fusing device accesses: the reference the fused programs are tested against.
#[cfg(test)]
pub(crate) fn compile_unfused(expr: &str) -> Result<Program, String> {
    let p = compile(expr)?;
    let parser = cel::parser::Parser::new().enable_optional_syntax(true);
    let (ast, info) = parser
        .parse_with_source_info(expr)
        .expect("parsed once already");
    let mut c = compile::Compiler::new(&info, expr);
    let (node, _) = c.compile(&ast).expect("compiled once already");
    Ok(Program { node, ..p })
}

/// A ResourceSlice device as selectors see it, read in place.
#[derive(Clone, Copy, Debug)]
pub struct RawDevice<'a> {
    pub driver: &'a str,
    pub attributes: Option<&'a BTreeMap<String, DeviceAttribute>>,
    pub capacity: Option<&'a BTreeMap<String, DeviceCapacity>>,
    pub allow_multiple_allocations: bool,
}

impl<'a> RawDevice<'a> {
    /// Device `d` of a slice of `driver`.
    pub fn of(driver: &'a str, d: &'a k8s_openapi::api::resource::v1::Device) -> Self {
        RawDevice {
            driver,
            attributes: d.attributes.as_ref(),
            capacity: d.capacity.as_ref(),
            allow_multiple_allocations: d.allow_multiple_allocations.unwrap_or(false),
        }
    }
}

impl Program {
    /// Evaluates against a device value from [`device_value`].
    pub fn eval(&self, device: &Value) -> Result<bool, String> {
        self.run(eval::DeviceInput::Value(device)).0
    }

    /// [`Program::eval`] with the runtime cost the evaluation reached (cel-go's `ActualCost`; on
    /// an error, what had been charged when it stopped).
    pub fn eval_cost(&self, device: &Value) -> (Result<bool, String>, u64) {
        self.run(eval::DeviceInput::Value(device))
    }

    /// [`Program::eval_raw`] with the runtime cost, as [`Program::eval_cost`].
    pub fn eval_raw_cost(&self, device: RawDevice<'_>) -> (Result<bool, String>, u64) {
        self.run(eval::DeviceInput::Raw(device))
    }

    /// Evaluates against a ResourceSlice device in place; it must have passed [`device_check`]
    /// (whose error is the evaluation's otherwise).
    pub fn eval_raw(&self, device: RawDevice<'_>) -> Result<bool, String> {
        self.run(eval::DeviceInput::Raw(device)).0
    }

    fn run(&self, device: eval::DeviceInput<'_>) -> (Result<bool, String>, u64) {
        let mut ctx = eval::Ctx {
            locals: vec![Value::Null; self.slots],
            device,
            built: None,
            cost: 0,
            skip_root: std::ptr::null(),
        };
        let out = match ctx.eval(&self.node) {
            _ if ctx.exceeded() => Err(eval::COST_EXCEEDED.to_string()),
            Ok(Value::Bool(b)) => Ok(b),
            Ok(other) => Err(format!(
                "CEL result of type {} could not be converted to bool",
                other.type_name()
            )),
            Err(e) => Err(e),
        };
        (out, ctx.cost)
    }
}

/// Compile-once cache keyed by expression text (like `cel.Cache`).
#[derive(Default)]
pub struct Cache {
    map: Mutex<HashMap<String, Arc<Result<Program, String>>>>,
}

impl Cache {
    pub fn get_or_compile(&self, expr: &str) -> Arc<Result<Program, String>> {
        let mut m = self.map.lock().expect("cel cache lock");
        if let Some(p) = m.get(expr) {
            return p.clone();
        }
        let p = Arc::new(compile(expr));
        m.insert(expr.to_string(), p.clone());
        p
    }
}

/// Adds the allocator's hint to `no such key` errors (`cel.EnhanceRuntimeError`).
pub fn enhance_runtime_error(e: &str) -> String {
    if e.contains("no such key:") {
        format!(
            "{e}. consider using CEL optional chaining (.? followed by orValue()) or guarding the check with has() for optional fields"
        )
    } else {
        e.to_string()
    }
}

/// The error [`device_value`] would give for this device, without building anything.
pub fn device_check(d: &RawDevice<'_>) -> Result<(), String> {
    for (name, a) in d.attributes.into_iter().flatten() {
        if a.int.is_none() && a.bool.is_none() && a.string.is_none() {
            if a.version.as_deref().is_some_and(semver::is_plain) {
                continue;
            }
            attribute_value(name, a)?;
        }
    }
    for (name, c) in d.capacity.into_iter().flatten() {
        capacity_value(name, c)?;
    }
    Ok(())
}

/// One attribute or capacity of a device as the whole `device` value would hold it under
/// `domain`/`id`: when a qualified and an unqualified name land on the same key, the first
/// in name order, as in [`device_value`].
pub(crate) fn raw_field(
    d: &RawDevice<'_>,
    capacity: bool,
    domain: &str,
    id: &str,
) -> Result<Option<Value>, String> {
    fn find<'m, V>(
        map: Option<&'m BTreeMap<String, V>>,
        driver: &str,
        domain: &str,
        id: &str,
    ) -> Option<(&'m String, &'m V)> {
        let map = map?;
        // The only names that can land on (domain, id): `id` itself, and the names that start
        // with `domain` (they sort together, right after it). `split_qualified` decides, as
        // for the whole value; the first in name order wins.
        let same_domain = map
            .range::<str, _>((
                std::ops::Bound::Excluded(domain),
                std::ops::Bound::Unbounded,
            ))
            .take_while(|(k, _)| k.starts_with(domain));
        map.get_key_value(id)
            .into_iter()
            .chain(same_domain)
            .filter(|(k, _)| split_qualified(k, driver) == (domain, id))
            .min_by_key(|(k, _)| *k)
    }
    if capacity {
        find(d.capacity, d.driver, domain, id)
            .map(|(name, c)| capacity_value(name, c))
            .transpose()
    } else {
        find(d.attributes, d.driver, domain, id)
            .map(|(name, a)| attribute_value(name, a))
            .transpose()
    }
}

fn attribute_value(name: &str, a: &DeviceAttribute) -> Result<Value, String> {
    Ok(if let Some(i) = a.int {
        Value::Int(i)
    } else if let Some(b) = a.bool {
        Value::Bool(b)
    } else if let Some(s) = &a.string {
        Value::str(s)
    } else if let Some(v) = &a.version {
        Value::Semver(Arc::new(semver::Semver::parse(v).map_err(|e| {
            format!("attribute {name}: parse semantic version: {e}")
        })?))
    } else {
        return Err(format!("attribute {name}: unsupported attribute value"));
    })
}

fn capacity_value(name: &str, c: &DeviceCapacity) -> Result<Value, String> {
    quantity::Quantity::parse(&c.value.0)
        .map(Value::Quantity)
        .map_err(|e| format!("capacity {name}: {e}"))
}

fn split_qualified<'a>(name: &'a str, driver: &'a str) -> (&'a str, &'a str) {
    match name.find('/') {
        Some(i) => (&name[..i], &name[i + 1..]),
        None => (driver, name),
    }
}

/// Builds the `device` variable: unqualified names under the driver's domain, versions as semver.
pub fn device_value(
    driver: &str,
    attributes: Option<&BTreeMap<String, DeviceAttribute>>,
    capacity: Option<&BTreeMap<String, DeviceCapacity>>,
    allow_multiple_allocations: bool,
) -> Result<Value, String> {
    let mut attrs: Vec<(String, value::MapVal)> = Vec::new();
    fn domain_entry<'m>(v: &'m mut Vec<(String, value::MapVal)>, d: &str) -> &'m mut value::MapVal {
        if let Some(i) = v.iter().position(|(k, _)| k == d) {
            return &mut v[i].1;
        }
        v.push((d.to_string(), value::MapVal::default()));
        &mut v.last_mut().expect("pushed").1
    }
    for (name, a) in attributes.into_iter().flatten() {
        let (dom, id) = split_qualified(name, driver);
        let val = attribute_value(name, a)?;
        domain_entry(&mut attrs, dom)
            .entries
            .push((Value::str(id), val));
    }
    let mut caps: Vec<(String, value::MapVal)> = Vec::new();
    for (name, c) in capacity.into_iter().flatten() {
        let (dom, id) = split_qualified(name, driver);
        let q = capacity_value(name, c)?;
        domain_entry(&mut caps, dom)
            .entries
            .push((Value::str(id), q));
    }
    let outer = |v: Vec<(String, value::MapVal)>| {
        Value::Map(Arc::new(value::MapVal {
            entries: v
                .into_iter()
                .map(|(k, m)| (Value::str(&k), Value::Map(Arc::new(m))))
                .collect(),
            default_empty: true,
        }))
    };
    Ok(Value::Device(Arc::new(value::DeviceVal {
        driver: Value::str(driver),
        attributes: outer(attrs),
        capacity: outer(caps),
        allow_multiple_allocations,
    })))
}

#[cfg(test)]
mod format_tests;
#[cfg(test)]
mod named_format_tests;
#[cfg(test)]
mod net_tests;
#[cfg(test)]
mod tests;
