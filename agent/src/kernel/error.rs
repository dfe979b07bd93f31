//! The error of a failed kernel conversation: a tool missing or failing, or netlink and
//! file I/O failing. [`crate::dataplane::Dataplane`] returns it from a sync too.

/// Why a sync failed. Each variant has a stable short label for metrics and for the
/// `Degraded` condition's reason.
#[derive(Debug, thiserror::Error)]
pub enum DataplaneError {
    /// A kernel tool (`iptables-restore`, `conntrack`, ...) is missing.
    #[error("{tool} not found: install it on the node ({hint})")]
    MissingTool {
        /// The tool.
        tool: String,
        /// What provides it.
        hint: String,
    },
    /// A kernel tool ran and failed.
    #[error("{tool} failed (exit {code:?}): {stderr}")]
    ToolFailed {
        /// The command line.
        tool: String,
        /// Exit code.
        code: Option<i32>,
        /// What it printed.
        stderr: String,
    },
    /// Any other I/O error talking to the kernel.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The error.
        source: std::io::Error,
    },
}

impl DataplaneError {
    /// A short stable label (`missing_tool`, `tool_failed`, `io`).
    #[must_use]
    pub fn label(&self) -> &'static str {
        match self {
            Self::MissingTool { .. } => "missing_tool",
            Self::ToolFailed { .. } => "tool_failed",
            Self::Io { .. } => "io",
        }
    }

    /// [`DataplaneError::Io`] with its context.
    #[must_use]
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Self::Io {
            context: context.into(),
            source,
        }
    }
}
