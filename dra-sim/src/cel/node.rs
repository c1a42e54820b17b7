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
