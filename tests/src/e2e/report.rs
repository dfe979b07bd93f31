//! The suite's output in libtest's format, so `cargo test` users and `tests/run-all.sh`
//! (which sums every `test result:` line) read it like any other test binary.

use std::time::Duration;

/// The variable naming a cluster's kubeconfig; without it the suites start a real control
/// plane of their own ([`crate::control_plane`]).
pub const KUBECONFIG_VARIABLE: &str = "E2E_KUBECONFIG";

/// Counts of one run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Scenarios that passed.
    pub passed: usize,
    /// Scenarios that failed.
    pub failed: usize,
    /// Scenarios not run.
    pub ignored: usize,
    /// Scenarios deselected by name filters.
    pub filtered_out: usize,
}

/// libtest's closing line.
#[must_use]
pub fn result_line(counts: Counts, elapsed: Duration) -> String {
    let Counts {
        passed,
        failed,
        ignored,
        filtered_out,
    } = counts;
    let verdict = if failed == 0 { "ok" } else { "FAILED" };
    format!(
        "test result: {verdict}. {passed} passed; {failed} failed; {ignored} ignored; 0 measured; \
         {filtered_out} filtered out; finished in {:.2}s",
        elapsed.as_secs_f64()
    )
}

/// libtest's line for one test.
#[must_use]
pub fn test_line(name: &str, ok: bool) -> String {
    format!("test {name} ... {}", if ok { "ok" } else { "FAILED" })
}

/// libtest's failure section: each failure's message, then the list of names.
#[must_use]
pub fn failures_section(failures: &[(&str, String)]) -> String {
    if failures.is_empty() {
        return String::new();
    }
    let mut out = String::from("\nfailures:\n");
    for (name, message) in failures {
        out.push_str(&format!("\n---- {name} ----\n{}\n", message.trim_end()));
    }
    out.push_str("\nfailures:\n");
    for (name, _) in failures {
        out.push_str(&format!("    {name}\n"));
    }
    out
}

/// The command line, as far as the suite honours libtest's: name filters (the suite
/// runs either every scenario or, when no name matches, none), `--skip`, `--list`;
/// other flags are accepted and ignored.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Args {
    /// Positional name filters.
    pub filters: Vec<String>,
    /// `--skip` filters.
    pub skips: Vec<String>,
    /// `--exact`.
    pub exact: bool,
    /// `--list`.
    pub list: bool,
}

/// libtest flags that take a value as the next argument.
const FLAGS_WITH_VALUE: [&str; 6] = [
    "--test-threads",
    "--color",
    "--format",
    "--logfile",
    "--shuffle-seed",
    "-Z",
];

impl Args {
    /// Parses libtest-style arguments (without the program name).
    #[must_use]
    pub fn parse(args: impl IntoIterator<Item = String>) -> Self {
        let mut out = Self::default();
        let mut args = args.into_iter();
        while let Some(arg) = args.next() {
            if arg == "--list" {
                out.list = true;
            } else if arg == "--exact" {
                out.exact = true;
            } else if let Some(value) = arg.strip_prefix("--skip=") {
                out.skips.push(value.to_owned());
            } else if arg == "--skip" {
                out.skips.extend(args.next());
            } else if FLAGS_WITH_VALUE.contains(&arg.as_str()) {
                let _ = args.next();
            } else if !arg.starts_with('-') {
                out.filters.push(arg);
            }
        }
        out
    }

    /// Whether the scenario `name` is selected.
    #[must_use]
    pub fn selects(&self, name: &str) -> bool {
        let matches = |f: &String| {
            if self.exact {
                name == f
            } else {
                name.contains(f.as_str())
            }
        };
        (self.filters.is_empty() || self.filters.iter().any(matches))
            && !self.skips.iter().any(matches)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_libtest_shaped() {
        let line = result_line(
            Counts {
                ignored: 7,
                ..Counts::default()
            },
            Duration::ZERO,
        );
        assert_eq!(
            line,
            "test result: ok. 0 passed; 0 failed; 7 ignored; 0 measured; 0 filtered out; \
             finished in 0.00s"
        );
        let failed = result_line(
            Counts {
                passed: 5,
                failed: 2,
                ..Counts::default()
            },
            Duration::from_millis(1234),
        );
        assert!(failed.starts_with("test result: FAILED. 5 passed; 2 failed; 0 ignored;"));
        assert!(failed.ends_with("finished in 1.23s"));
        assert_eq!(test_line("x", true), "test x ... ok");
        assert_eq!(test_line("x", false), "test x ... FAILED");
        assert!(failures_section(&[]).is_empty());
        let section = failures_section(&[("a", "boom\n".to_owned())]);
        assert!(section.contains("---- a ----\nboom\n"));
        assert!(section.ends_with("failures:\n    a\n"));
    }

    #[test]
    fn filters_skips_and_flags() {
        let args = Args::parse(
            [
                "--test-threads",
                "1",
                "plans",
                "--skip",
                "node",
                "--nocapture",
            ]
            .map(str::to_owned),
        );
        assert_eq!(args.filters, ["plans"]);
        assert_eq!(args.skips, ["node"]);
        assert!(args.selects("merged_plans"));
        assert!(!args.selects("plan_per_node"));
        assert!(!args.selects("crds"));
        assert!(Args::parse([]).selects("anything"));
        let exact = Args::parse(["--exact", "crds"].map(str::to_owned));
        assert!(exact.selects("crds") && !exact.selects("crds_established"));
        assert!(Args::parse(["--list".to_owned()]).list);
    }
}
