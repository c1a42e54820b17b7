//! The checked program: what the type checker (`compile`) produces, `fuse` rewrites and the
//! interpreter (`eval`) runs.
use super::func::Func;
use super::value::Value;
use std::sync::Arc;

#[derive(Debug)]
pub enum Node {
    Const(Value),
    Device,
    Local(usize),
    Select {
        operand: Box<Node>,
        field: Value,
        test: bool,
    },
    OptSelect {
        operand: Box<Node>,
        field: Value,
    },
    And(Box<Node>, Box<Node>),
    OrOp(Box<Node>, Box<Node>),
    Cond(Box<Node>, Box<Node>, Box<Node>),
    Call {
        func: Func,
        args: Vec<Node>,
    },
    List {
        elems: Vec<Node>,
        optional: Vec<bool>,
    },
    Map {
        entries: Vec<(Node, Node, bool)>,
    },
    Comp(Box<Comp>),
    Bind {
        slot: usize,
        init: Box<Node>,
        body: Box<Node>,
    },
    /// Regex calls with a literal pattern keep the compiled regex.
    RegexCall {
        func: Func,
        target: Box<Node>,
        re: Arc<regex::Regex>,
    },
    /// `x in [...]` over a literal list of constant scalars, which cel-go plans as a lookup in a
    /// Go map of the members (see `plan.rs`).
    InSet {
        needle: Box<Node>,
        set: Arc<Vec<Value>>,
    },
    /// `device.driver` / `device.allowMultipleAllocations`, read straight from the device
    /// (see `fuse.rs`).
    DeviceProp(DeviceProp),
    /// `device.attributes[domain].id` or `device.capacity[domain].id` in any of its spellings,
    /// read straight from the device (see `fuse.rs`).
    DeviceField {
        capacity: bool,
        domain: Arc<str>,
        id: Arc<str>,
        mode: FieldMode,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceProp {
    Driver,
    AllowMultipleAllocations,
}

/// What a fused field access answers: the value (`.id`, `[id]`), presence (`has(.id)`) or an
/// optional (`.?id`, `[?id]`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FieldMode {
    Get,
    Has,
    Opt,
}

#[derive(Debug)]
pub struct Comp {
    pub range: Node,
    pub var1: usize,
    pub var2: Option<usize>,
    pub accu: usize,
    pub init: Node,
    pub cond: Node,
    pub step: Node,
    pub result: Node,
}

impl Node {
    /// The nodes this one evaluates.
    fn children(&self) -> Vec<&Node> {
        match self {
            Node::Select { operand, .. } | Node::OptSelect { operand, .. } => vec![operand],
            Node::And(a, b) | Node::OrOp(a, b) => vec![a, b],
            Node::Cond(c, a, b) => vec![c, a, b],
            Node::Call { args, .. } => args.iter().collect(),
            Node::List { elems, .. } => elems.iter().collect(),
            Node::Map { entries } => entries.iter().flat_map(|(k, v, _)| [k, v]).collect(),
            Node::Comp(c) => vec![&c.range, &c.init, &c.cond, &c.step, &c.result],
            Node::Bind { init, body, .. } => vec![init, body],
            Node::RegexCall { target, .. } => vec![target],
            Node::InSet { needle, .. } => vec![needle],
            Node::Const(_)
            | Node::Device
            | Node::Local(_)
            | Node::DeviceProp(_)
            | Node::DeviceField { .. } => Vec::new(),
        }
    }

    /// How deeply nodes nest under this one (1 for a leaf).
    pub fn depth(&self) -> usize {
        1 + self
            .children()
            .into_iter()
            .map(Node::depth)
            .max()
            .unwrap_or(0)
    }
}
