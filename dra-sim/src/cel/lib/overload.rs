//! What overload resolution works with: a call's signature and the answer a library gives.
use crate::cel::func::Func;
use crate::cel::types::Ty;

/// Overload resolution's answer: `Err(None)` is "no matching overload", `Err(Some(msg))` another
/// error.
pub type Resolved = Result<(Func, Ty), Option<String>>;

/// A call as overload resolution sees it: the function's (namespaced) name, whether it has a
/// receiver, and the static types of the receiver (first) and the arguments.
pub(crate) struct Sig<'a> {
    pub name: &'a str,
    pub member: bool,
    pub t: &'a [Ty],
}

impl Sig<'_> {
    /// Argument `i` is `dyn` (or a type checked only at run time).
    pub fn d(&self, i: usize) -> bool {
        self.t[i].is_dyn()
    }

    /// Argument `i` is of type `ty`, or `dyn`.
    pub fn is(&self, i: usize, ty: &Ty) -> bool {
        self.t[i].is_dyn() || &self.t[i] == ty
    }

    /// Argument `i` is a list, or `dyn`.
    pub fn list_like(&self, i: usize) -> bool {
        matches!(self.t[i], Ty::List(_)) || self.d(i)
    }
}
