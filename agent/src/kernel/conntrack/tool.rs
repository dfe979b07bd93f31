//! UDP conntrack entries through the `conntrack` tool (what a [`crate::kernel::command::
//! Runner`] does unless it knows better, as [`crate::kernel::command::CommandRunner`] does
//! with ctnetlink): list them, delete them, read its output.

use std::net::IpAddr;

use super::flows::{CONNTRACK, Flow, StaleFlows};
use crate::kernel::command::output::CommandOutput;
use crate::kernel::error::DataplaneError;
use crate::kernel::family::Family;

/// Runs a program with arguments and no input (a [`crate::kernel::command::Runner`]'s
/// `run`).
pub type RunTool<'a> = &'a dyn Fn(&str, &[&str]) -> Result<CommandOutput, DataplaneError>;

/// Parses `conntrack -L -p udp` output (one entry per line, `key=value` words: the
/// original tuple first, then the reply tuple). Lines that do not parse are skipped.
#[must_use]
pub fn parse_listing(text: &str) -> Vec<Flow> {
    text.lines().filter_map(parse_flow).collect()
}

fn parse_flow(line: &str) -> Option<Flow> {
    let mut src = Vec::new();
    let mut dst = Vec::new();
    let mut sport = Vec::new();
    let mut dport = Vec::new();
    for word in line.split_whitespace() {
        let Some((key, value)) = word.split_once('=') else {
            continue;
        };
        match key {
            "src" => src.push(value.parse::<IpAddr>().ok()?),
            "dst" => dst.push(value.parse::<IpAddr>().ok()?),
            "sport" => sport.push(value.parse::<u16>().ok()?),
            "dport" => dport.push(value.parse::<u16>().ok()?),
            _ => {}
        }
    }
    Some(Flow {
        orig_src: *src.first()?,
        orig_dst: *dst.first()?,
        sport: *sport.first()?,
        dport: *dport.first()?,
        reply_src: *src.get(1)?,
        reply_sport: *sport.get(1)?,
    })
}

/// How many entries `conntrack -D` reports deleted.
fn deleted_count(output: &CommandOutput) -> Option<usize> {
    let text = format!("{}{}", output.stderr, output.stdout);
    let before = text.split(" flow entries have been deleted").next()?;
    if before.len() == text.len() {
        return None;
    }
    before
        .rsplit(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

/// Deletes the entries with the `conntrack` tool; returns how many the kernel had.
///
/// # Errors
/// When `conntrack` is missing or fails (finding nothing to delete is not a failure).
pub fn delete(run: RunTool<'_>, flows: &StaleFlows) -> Result<usize, DataplaneError> {
    let args = flows.conntrack_args();
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    let output = run(CONNTRACK, &argv)?;
    match (output.code, deleted_count(&output)) {
        (Some(0), count) => Ok(count.unwrap_or(0)),
        (Some(1), Some(0)) => Ok(0),
        _ => Err(output.failure(&format!("{CONNTRACK} {}", args.join(" ")))),
    }
}

/// Lists the UDP entries of one family with the `conntrack` tool.
///
/// # Errors
/// When `conntrack` is missing or fails.
pub fn list_udp(run: RunTool<'_>, family: Family) -> Result<Vec<Flow>, DataplaneError> {
    let family = match family {
        Family::V4 => "ipv4",
        Family::V6 => "ipv6",
    };
    let argv = ["-L", "-p", "udp", "-f", family];
    let output = run(CONNTRACK, &argv)?;
    if output.code != Some(0) {
        return Err(output.failure(&format!("{CONNTRACK} {}", argv.join(" "))));
    }
    Ok(parse_listing(&output.stdout))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deleted_counts_are_read_from_the_message() {
        let out = |code, stderr: &str| CommandOutput {
            code: Some(code),
            stdout: String::new(),
            stderr: stderr.to_owned(),
        };
        assert_eq!(
            deleted_count(&out(
                0,
                "conntrack v1.4.7 (conntrack-tools): 12 flow entries have been deleted.\n"
            )),
            Some(12)
        );
        assert_eq!(
            deleted_count(&out(
                1,
                "conntrack v1.4.7 (conntrack-tools): 0 flow entries have been deleted."
            )),
            Some(0)
        );
        assert_eq!(deleted_count(&out(1, "conntrack: operation failed")), None);
    }
}
