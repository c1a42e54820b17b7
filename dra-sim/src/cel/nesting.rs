//! cel-go's limits on how deeply an expression nests, and a stack to compile any expression on.
//!
//! cel-go's parser refuses, with `expression recursion limit exceeded: 250`, an expression whose
//! grammar rule `expr` nests more than 250 deep (parentheses, call arguments, list members, map
//! entries, macro bodies: the `cel` crate's parser counts the same rule, configured here), and,
//! with `max recursion depth exceeded`, one whose parse tree nests more than 250 of the
//! constructs its visitor counts: ternaries, relations, arithmetic, field selections, member
//! calls (macros included) and indexes (not `&&`, `||`, unary operators, global calls or
//! literals, and not the parentheses themselves). [`visitor_depth`] counts these on the parsed
//! expression. What differs: cel-go counts each grammar rule on its own, so where a relation or
//! arithmetic nests one or two deeper than `expr` (`((1 + 1) + 1) > 0`), the exact limit is
//! reached a level or two earlier there.
//!
//! Parsing, checking and planning recurse over the expression, and the `cel` crate's parser
//! needs kilobytes of stack per level in a debug build (before the depth can be counted):
//! [`on_big_stack`] runs them on a thread of their own with room for the deepest expression.
use cel::IdedExpr;
use cel::common::ast::{EntryExpr, Expr};

/// cel-go's parser's limit on the length of an expression (the API server allows selectors of
/// 10 KiB only).
pub const MAX_CODE_POINTS: usize = 100_000;

/// cel-go's default limit for both counts.
pub const MAX_DEPTH: usize = 250;
/// What the `cel` crate's parser is configured with for a limit of [`MAX_DEPTH`] `expr` rules
/// (it counts from the first nested one).
pub const PARSER_LIMIT: u16 = 249;

pub const RECURSION_LIMIT: &str =
    "compilation failed: ERROR: <input>:-1:0: expression recursion limit exceeded: 250";
pub const DEPTH_EXCEEDED: &str =
    "compilation failed: ERROR: <input>:-1:0: max recursion depth exceeded";

/// Stack for compiling: enough in a debug build for 10 KiB of `1+1+…` (5,000 levels), the
/// deepest parse tree a selector the API server admits can have, and in a release build for
/// the 100,000 code points cel-go parses; reserved, not used, by the thread.
const COMPILE_STACK: usize = 256 << 20;

/// Runs `f` on a thread with [`COMPILE_STACK`] (or here, if no such thread can be made).
pub fn on_big_stack<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    let mut f = Some(f);
    let out = std::thread::scope(|s| {
        let run = || f.take().map(|f| f());
        std::thread::Builder::new()
            .name("cel-compile".into())
            .stack_size(COMPILE_STACK)
            .spawn_scoped(s, run)
            .ok()
            .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
    });
    match out.flatten() {
        Some(v) => v,
        None => f.take().map(|f| f()).expect("runs once"),
    }
}

/// The deepest path of constructs cel-go's parse-tree visitor counts (see the module docs).
pub fn visitor_depth(e: &IdedExpr) -> usize {
    depth(e, None)
}

/// [`visitor_depth`]; `accu`: the accumulator of the comprehension `e` is in, whose `?:` and `+`
/// over it are the macro's own (no part of the parse tree).
fn depth(e: &IdedExpr, accu: Option<&str>) -> usize {
    let d = |x: &IdedExpr| depth(x, accu);
    let (own, inner) = match &e.expr {
        Expr::Call(c) => {
            let macros_own = c
                .args
                .iter()
                .any(|a| matches!(&a.expr, Expr::Ident(n) if Some(n.as_str()) == accu));
            let parts = c.target.iter().map(|t| d(t)).chain(c.args.iter().map(d));
            (counted(&e.expr) && !macros_own, parts.max())
        }
        Expr::Comprehension(c) => {
            let inside = |x: &IdedExpr| depth(x, Some(c.accu_var.as_str()));
            let body = [&c.loop_cond, &c.loop_step, &c.result]
                .into_iter()
                .map(inside);
            (true, body.chain([d(&c.iter_range), d(&c.accu_init)]).max())
        }
        Expr::List(l) => (false, l.elements.iter().map(d).max()),
        Expr::Map(m) => (
            false,
            m.entries
                .iter()
                .filter_map(|en| match &en.expr {
                    EntryExpr::MapEntry(me) => Some(d(&me.key).max(d(&me.value))),
                    _ => None,
                })
                .max(),
        ),
        Expr::Select(s) => (true, Some(d(&s.operand))),
        Expr::Struct(_) | Expr::Ident(_) | Expr::Literal(_) | Expr::Unspecified => (false, None),
    };
    usize::from(own) + inner.unwrap_or(0)
}

/// Whether cel-go's visitor counts this construct.
fn counted(e: &Expr) -> bool {
    match e {
        Expr::Call(c) => {
            c.target.is_some()
                || matches!(
                    c.func_name.as_str(),
                    "_?_:_"
                        | "_==_"
                        | "_!=_"
                        | "_<_"
                        | "_<=_"
                        | "_>_"
                        | "_>=_"
                        | "@in"
                        | "_+_"
                        | "_-_"
                        | "_*_"
                        | "_/_"
                        | "_%_"
                        | "_[_]"
                        | "_[?_]"
                        | "_?._"
                )
        }
        _ => false,
    }
}
