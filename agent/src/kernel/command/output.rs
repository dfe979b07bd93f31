//! What a tool printed and how it ended, how its input is written, and which package
//! provides it.

use std::io::Write;

use crate::kernel::error::DataplaneError;

/// What a command printed and how it ended.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CommandOutput {
    /// Exit code (`None` when killed by a signal).
    pub code: Option<i32>,
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
}

impl CommandOutput {
    /// Whether the command exited with 0.
    #[must_use]
    pub fn success(&self) -> bool {
        self.code == Some(0)
    }

    /// The error for a failed `tool` (a command line).
    #[must_use]
    pub fn failure(&self, tool: &str) -> DataplaneError {
        DataplaneError::ToolFailed {
            tool: tool.to_owned(),
            code: self.code,
            stderr: self.stderr.trim().to_owned(),
        }
    }
}

/// Writes a tool's input into the pipe it reads from.
pub type InputWriter<'a> = dyn FnMut(&mut dyn Write) -> std::io::Result<()> + 'a;

/// The Debian package that provides `program`.
#[must_use]
pub fn package_of(program: &str) -> &'static str {
    match program {
        "conntrack" => "conntrack",
        "ip" => "iproute2",
        "ipset" => "ipset",
        _ => "iptables",
    }
}

/// The error for a program that does not exist.
pub(crate) fn missing(program: &str) -> DataplaneError {
    DataplaneError::MissingTool {
        tool: program.to_owned(),
        hint: format!("Debian package {}", package_of(program)),
    }
}
