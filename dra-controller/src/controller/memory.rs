//! Process-wide memory settings of the long-running controller.

/// Turns transparent huge pages off for this process. mimalloc marks its arena `MADV_HUGEPAGE`, so
/// the kernel backs every touched 2 MiB range of it with a whole huge page (at the fault, or later
/// through khugepaged): a small heap of scattered objects is then resident at twice its size or
/// more. The controller mostly waits on the API server, where huge pages' fewer TLB misses buy
/// nothing. `simulate` and the other one-shot commands keep them.
pub fn no_huge_pages() {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: PR_SET_THP_DISABLE only sets a flag on this process's memory map.
        let rc = unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
        if rc != 0 {
            tracing::debug!(error = %std::io::Error::last_os_error(), "could not turn off transparent huge pages");
        }
    }
}
