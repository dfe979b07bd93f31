//! The iptables tools: which back end (nft or legacy) and binary to run, how the node's
//! back end is detected, and how a rule's words are read from `iptables-save`.

use std::str::FromStr;

use crate::kernel::command::runner::Runner;
use crate::kernel::family::Family;

/// The iptables back end asked for on the command line.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum BackendChoice {
    /// The one the node already uses (see [`detect_backend`]).
    #[default]
    Auto,
    /// `iptables-nft`.
    Nft,
    /// `iptables-legacy`.
    Legacy,
}

impl FromStr for BackendChoice {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "auto" => Ok(Self::Auto),
            "nft" => Ok(Self::Nft),
            "legacy" => Ok(Self::Legacy),
            other => Err(format!(
                "unknown iptables back end {other:?} (auto, nft or legacy)"
            )),
        }
    }
}

impl std::fmt::Display for BackendChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Auto => "auto",
            Self::Nft => "nft",
            Self::Legacy => "legacy",
        })
    }
}

/// An iptables back end: which binaries the agent runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// `iptables-nft`, `iptables-nft-save`, `iptables-nft-restore` (and `ip6tables-nft*`).
    Nft,
    /// `iptables-legacy`, `iptables-legacy-save`, `iptables-legacy-restore`.
    Legacy,
}

/// The three iptables tools.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tool {
    /// `iptables`.
    Iptables,
    /// `iptables-save`.
    Save,
    /// `iptables-restore`.
    Restore,
}

impl Backend {
    /// The binary of `tool` for `family`, e.g. `ip6tables-nft-restore`.
    #[must_use]
    pub fn binary(self, family: Family, tool: Tool) -> String {
        let base = match family {
            Family::V4 => "iptables",
            Family::V6 => "ip6tables",
        };
        let backend = match self {
            Self::Nft => "nft",
            Self::Legacy => "legacy",
        };
        let suffix = match tool {
            Tool::Iptables => "",
            Tool::Save => "-save",
            Tool::Restore => "-restore",
        };
        format!("{base}-{backend}{suffix}")
    }

    /// The back end a choice names; `Auto` asks the kernel.
    pub fn resolve(choice: BackendChoice, runner: &dyn Runner) -> Self {
        match choice {
            BackendChoice::Nft => Self::Nft,
            BackendChoice::Legacy => Self::Legacy,
            BackendChoice::Auto => detect_backend(runner),
        }
    }
}

/// The back end the node already uses, as kubernetes-sigs/iptables-wrappers decides: the
/// one whose `*-save` (both families, all loaded tables) prints more rules; nft on a tie,
/// so an empty node gets nft. A back end whose tools are missing counts zero rules.
pub fn detect_backend(runner: &dyn Runner) -> Backend {
    let rules = |backend: Backend| -> usize {
        [Family::V4, Family::V6]
            .into_iter()
            .filter_map(|family| {
                runner
                    .run(&backend.binary(family, Tool::Save), &[], None)
                    .ok()
            })
            .map(|out| out.stdout.lines().filter(|l| l.starts_with('-')).count())
            .sum()
    };
    if rules(Backend::Legacy) > rules(Backend::Nft) {
        Backend::Legacy
    } else {
        Backend::Nft
    }
}

/// Seconds `iptables-restore` and `iptables` wait for the xtables lock (legacy back end;
/// the nft tools accept and ignore the flag).
pub const LOCK_WAIT: &str = "5";

/// Splits one line of `iptables-save` output into words, removing the double quotes
/// around words with spaces and their backslash escapes.
#[must_use]
pub fn split_words(line: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut quoted = false;
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' if quoted => {
                if let Some(next) = chars.next() {
                    word.push(next);
                }
            }
            '"' => {
                quoted = !quoted;
                in_word = true;
            }
            c if c.is_whitespace() && !quoted => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            c => {
                word.push(c);
                in_word = true;
            }
        }
    }
    if in_word {
        words.push(word);
    }
    words
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(line: &str) -> Vec<String> {
        split_words(line)
    }

    #[test]
    fn words_unquote_like_iptables_save() {
        assert_eq!(
            words(r#"-A X -m comment --comment "a b \"c\"" -j Y"#),
            [
                "-A",
                "X",
                "-m",
                "comment",
                "--comment",
                "a b \"c\"",
                "-j",
                "Y"
            ]
        );
        assert_eq!(
            words("-m comment --comment proxyplan-rev:abc"),
            words(r#"-m comment --comment "proxyplan-rev:abc""#)
        );
        assert_eq!(words(r#"--comment """#), ["--comment", ""]);
    }
}
