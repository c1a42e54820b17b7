//! The Kubernetes DRA CEL environment (`k8s.io/dynamic-resource-allocation/cel`), built on the `cel`
//! crate (0.15).
//!
//! What comes from the `cel` crate: the parser only — ANTLR grammar, macro expansion of `has`,
//! `all`, `exists`, `exists_one`, `map`, `filter`, optional syntax `.?`/`[?]`, source positions and
//! the `ERROR: <input>:L:C:` parse-error text (wrapped in `compile()`: `compilation failed: ` prefix
//! and cel-go's ` | ` caret-line indentation).
//!
//! Where we extend or wrap it (the crate has no static checker, no Kubernetes libraries and no cost
//! limits, and its interpreter cannot express the `device` object's defaulting maps), by layer,
//! each depending only on those above it:
//! - `quote`, `types`, `func`: Go's string quoting; the static types; the functions a program
//!   calls (`Func`, grouped by library).
//! - `value/`: runtime values (`Value`) and the Kubernetes value types, each with its own parsing,
//!   printing and comparison and no library code: `quantity` (parsing, comparison, arithmetic and
//!   canonical formatting that keeps the parsed format: `10Gi` stays `10Gi`), `semver` (blang/semver
//!   rules and the library's normalize mode), `net` and `url` (Go's `net/netip` and `net/url`
//!   rules for what parses and how it prints: `ParseRequestURI`, then `Parse`; Go 1.26 strict
//!   colons), `named_format` (the 13 named formats with apimachinery's name, label-key and
//!   label-value rules and its trailing-dash masking for the `...Prefix` formats, `net/url`'s
//!   `ParseRequestURI` for `uri`, kube-openapi's uuid, base64, date and date-time checks, and their
//!   exact messages).
//! - `lib/`: one module per CEL library holding everything about its functions — the names it
//!   declares, overload resolution, evaluation and the runtime price: `stdlib` and `conversions`
//!   (cel-go's standard library), `regex` (`matches`, `find`, `findAll`), `strings` (ext.Strings
//!   v2 and `strings.quote`), `format` (ext.Strings `"<format>".format([args])` as v2 has it:
//!   cel-go's first formatter, en_US `%f` grouping, `%e` with superscript exponents, with its
//!   compile-time check of literal calls and the exemption of its arguments from the
//!   homogeneous-literal rule), `lists` (ext.Lists v3 and the Kubernetes lists library v1 with
//!   `includes`, new in 1.37), `sets` (ext.Sets), `optional`, `quantity` (`sign(q)` is a global
//!   function, as upstream), `semver`, `net` (`ip`, `isIP`, `ip.isCanonical`, `cidr`, `isCIDR`,
//!   their member functions, and the estimator's charges for parsing), `url`, `named_format`
//!   (`format.named(string)`, an optional `kubernetes.NamedFormat`; `format.<name>()`;
//!   `<format>.validate(string)`, none when valid, else the messages, priced as the estimator's
//!   regex match; looked up by full name before `format` is taken as an identifier, as in
//!   cel-go), and `authz` (`kubernetes.authorization.*` types and their member functions: the DRA
//!   environment has no `authorizer` variable, so no value of these types exists; calls only
//!   type-check through `dyn`, and fail with `no such overload` when run).
//! - `compile/`: a type checker with the DRA declarations (`device.driver`, `attributes` as
//!   `map(string, map(string, google.protobuf.Any))`, `capacity` as
//!   `map(string, map(string, kubernetes.Quantity))`, `allowMultipleAllocations`) and the
//!   libraries' signatures, giving cel-go's compile errors (undeclared reference, no matching
//!   overload, heterogeneous literals, result must be bool or the unknown type) and regex-literal
//!   validation. Macros the crate's parser leaves as plain calls are expanded into our
//!   comprehension nodes (`compile/macros.rs`): two-variable comprehensions
//!   (`all/exists/existsOne(k, v, p)`), `transformList`, `transformMap`, `transformMapEntry` (with
//!   and without filter), the ext.Lists `sortBy` macro, and `cel.bind`.
//! - `plan`: what cel-go's planner computes when it builds the program (`OptOptimize`):
//!   conversions and literals of constants, `in` over constant lists as a Go map lookup, constant
//!   regex patterns and index types; a failure there is a compile error (`program instantiation
//!   failed`), as in cel-go. `nesting`: cel-go's limits on nesting (250) and expression size, and
//!   the big stack compiling (and evaluating a deep program) runs on.
//! - `device`, `fuse`: selectors read the attributes they name straight from the ResourceSlice
//!   device ([`RawDevice`]); the whole `device` value ([`device_value`]) is built only for other
//!   uses of `device`. [`device_check`] raises the conversion errors the whole value would, once
//!   per device (the allocator keeps the outcome in its `DeviceCache`).
//! - `eval/`: our own interpreter over the checked program (compiled once, cached by `Cache`),
//!   with cel-go's error-absorbing `&&`/`||`, heterogeneous equality, cross-type numeric
//!   comparison, optional types (presence tests on non-maps answer "absent" like cel-go), and a
//!   runtime cost counter with the 1,000,000 limit (`actual cost limit exceeded`) that counts as
//!   cel-go's cost tracker does with the Kubernetes estimator (`ActualCost`): identifiers and
//!   qualifiers 1 (presence tests and missed optional qualifiers nothing), constants and literals
//!   of constants nothing (built when planning), other list/map literals 10/30, calls by the
//!   libraries' prices on the argument values, calls after a failed argument as cel-go still
//!   charges them, and the limit checked after each step, ending the evaluation.
//!
//! Checked against cel-go by `tests/differential.rs` (random selectors over random devices,
//! through the Go oracle on k8s.io/dynamic-resource-allocation v0.37.2): results, error kinds and
//! the runtime cost of every evaluation cel-go reports one for; and, by its CEL-only half
//! (`tests/differential/cel_*.rs`, 10,000 expressions a run, `SIM_DIFF_CASES=200000` for more),
//! the outcome of expressions built to find differences: every operator on attribute values of
//! each kind, quantities, literals and `dyn`; macros over members that fail; `has()` and optionals
//! on missing keys; leading minus; what the planner computes. `tests/fuzz.rs` feeds the parser,
//! checker and interpreter random and deeply nested text: no panic, no stack overflow, no hang.
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
//! cel-go's rules as read from its source, unchecked. The CEL-only half compares outcomes, not
//! costs: comparing them too over its 10,000 expressions finds 51 of 5,653 a unit or two off, in
//! shapes no selector needs: a comparison or `in` whose price depends on the overload cel-go's
//! checker picked (`dyn(7) >= ''` is priced as a string comparison there), and qualifiers of
//! optional values or by attributes on values that are not maps.
//! Type variables: cel-go binds the element type of `[]` (and `{}`, `optional.none()`) at its
//! first use and holds later uses to it; we bind a local variable of such a type where an
//! operator or a one-operand function's first overload takes it (`x != 1`, `1.5 < x`, `-x`,
//! `size(x)`, `int(x)`), not through other library functions (`x.startsWith('a')`) or an
//! index (`x[0] == 1`), which leave it open here and bind it there (the differential generates
//! only the first kind). Nesting at exactly the limit: cel-go counts each grammar rule on its
//! own, so an expression whose arithmetic or relations nest a level deeper than its parentheses
//! (`((1 + 1) + 1) > 0` at 249 parentheses) is refused there a level earlier. Where cel-go's
//! planner panics (a constant map key Go cannot hash: bytes, semver) we report a compile error,
//! as the API server's answer means the selector is never stored. `sort()` of more than 12
//! members sorts stably, Go's `sort.Slice` does not: the order of equal but distinct members
//! (`0.0`, `-0.0`) or of NaN may differ.
pub mod compile;
pub mod device;
pub mod eval;
pub mod func;
pub mod fuse;
pub mod lib;
pub mod nesting;
pub mod node;
pub mod plan;
pub mod quote;
pub mod types;
pub mod value;

pub use device::{RawDevice, device_check, device_value};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
pub use value::Value;

/// Kubernetes' `CELSelectorExpressionMaxLength`.
pub const MAX_EXPRESSION_LENGTH: usize = 10 * 1024;

#[derive(Debug)]
pub struct Program {
    node: node::Node,
    slots: usize,
    /// Nested deeper than a thread's default stack is sure to hold in a debug build: evaluated
    /// on a thread of its own (see `nesting`). cel-go evaluates up to 250 levels.
    deep: bool,
}

/// Node depth from which an evaluation moves to a big stack; selectors are far shallower.
const DEEP: usize = 48;

/// Compiles a selector as the scheduler's cache does. Errors read like Kubernetes':
/// `compilation failed: ERROR: <input>:1:3: ...`, or `must evaluate to bool ...`.
pub fn compile(expr: &str) -> Result<Program, String> {
    compile_with(expr, true)
}

/// [`compile`] without fusing device accesses: the reference the fused programs are tested
/// against.
#[cfg(test)]
pub(crate) fn compile_unfused(expr: &str) -> Result<Program, String> {
    compile_with(expr, false)
}

fn compile_with(expr: &str, fused: bool) -> Result<Program, String> {
    let size = expr.chars().count();
    if size > nesting::MAX_CODE_POINTS {
        return Err(format!(
            "compilation failed: ERROR: <input>:-1:0: expression code point size exceeds limit: size: {size}, limit {}",
            nesting::MAX_CODE_POINTS
        ));
    }
    nesting::on_big_stack(|| {
        let p = checked(expr)?;
        Ok(if fused {
            Program {
                node: fuse::fuse(p.node),
                ..p
            }
        } else {
            p
        })
    })
}

/// Parsing, checking and planning (see `nesting` for the stack they run on).
fn checked(expr: &str) -> Result<Program, String> {
    let parser = cel::parser::Parser::new()
        .enable_optional_syntax(true)
        .max_recursion_depth(nesting::PARSER_LIMIT);
    let (ast, info) = parser.parse_with_source_info(expr).map_err(|e| {
        let e = e.to_string();
        if e.contains("Recursion limit of") {
            return nesting::RECURSION_LIMIT.to_string();
        }
        format!("compilation failed: {}", e.replace("\n| ", "\n | "))
    })?;
    if nesting::visitor_depth(&ast) > nesting::MAX_DEPTH {
        return Err(nesting::DEPTH_EXCEEDED.into());
    }
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
    if let Some(e) = c.unplannable {
        return Err(e);
    }
    let node = plan::plan(node)?;
    Ok(Program {
        deep: node.depth() > DEEP,
        node,
        slots: c.max_slots,
    })
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
        if self.deep {
            return nesting::on_big_stack(|| self.run_here(device));
        }
        self.run_here(device)
    }

    fn run_here(&self, device: eval::DeviceInput<'_>) -> (Result<bool, String>, u64) {
        let mut ctx = eval::Ctx {
            locals: vec![Ok(Value::Null); self.slots],
            device,
            built: None,
            cost: 0,
            skip_root: std::ptr::null(),
            panic: None,
        };
        let out = match ctx.eval(&self.node) {
            _ if ctx.exceeded() => Err(eval::COST_EXCEEDED.to_string()),
            _ if ctx.panic.is_some() => Err(ctx.panic.take().expect("just checked")),
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

#[cfg(test)]
mod cost_tests;
#[cfg(test)]
mod format_tests;
#[cfg(test)]
mod fuse_tests;
#[cfg(test)]
mod named_format_tests;
#[cfg(test)]
mod net_tests;
#[cfg(test)]
mod tests;
