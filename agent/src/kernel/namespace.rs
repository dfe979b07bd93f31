//! Work in another network namespace: a thread enters it, the caller's stays as it was.

use std::io;

/// Runs `work` on a thread that has entered the network namespace at `path`; the caller's
/// namespace is untouched. A socket opened there stays in that namespace.
pub fn in_namespace<T: Send>(
    path: &std::path::Path,
    work: impl FnOnce() -> io::Result<T> + Send,
) -> io::Result<T> {
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                let file = std::fs::File::open(path)?;
                nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET)
                    .map_err(io::Error::from)?;
                work()
            })
            .join()
            .unwrap_or_else(|_| Err(io::Error::other("namespace thread panicked")))
    })
}
