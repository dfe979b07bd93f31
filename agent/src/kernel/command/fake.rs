//! A fake kernel for tests, in the spirit of kube-proxy's `pkg/util/iptables/testing`:
//! an in-memory iptables (both families, `filter` and `nat`, any back end's tool names)
//! that understands the commands and `iptables-restore` input the agent sends, applies
//! each table's section atomically at `COMMIT`, prints `iptables-save` output, and a UDP
//! conntrack table. Every call is recorded for assertions.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use super::output::{CommandOutput, package_of};
use super::runner::Runner;
use crate::kernel::conntrack::flows::Flow;
use crate::kernel::error::DataplaneError;
use crate::kernel::family::Family;
use crate::kernel::iptables::split_words;

/// One command the fake was asked to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    /// The program, e.g. `iptables-nft-restore`.
    pub program: String,
    /// Its arguments.
    pub args: Vec<String>,
    /// What it was fed.
    pub stdin: Option<String>,
}

impl Call {
    /// Whether this is an `*-save`.
    #[must_use]
    pub fn is_save(&self) -> bool {
        self.program.ends_with("-save")
    }

    /// Whether this is an `*-restore`.
    #[must_use]
    pub fn is_restore(&self) -> bool {
        self.program.ends_with("-restore")
    }
}

/// The fake kernel. Clones share state, so a test keeps one and hands another to the
/// dataplane.
#[derive(Debug, Clone, Default)]
pub struct FakeKernel {
    state: Arc<Mutex<State>>,
}

#[derive(Debug, Default)]
struct State {
    tables: BTreeMap<(Family, String), Table>,
    calls: Vec<Call>,
    flows: Vec<Flow>,
    failing_restores: usize,
    missing: BTreeSet<String>,
    sysctls: BTreeMap<String, String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Chain {
    name: String,
    builtin: bool,
    rules: Vec<Vec<String>>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Table {
    chains: Vec<Chain>,
}

const TARGETS: [&str; 14] = [
    "ACCEPT",
    "DROP",
    "REJECT",
    "RETURN",
    "DNAT",
    "SNAT",
    "MASQUERADE",
    "MARK",
    "CONNMARK",
    "LOG",
    "NOTRACK",
    "REDIRECT",
    "CT",
    "TPROXY",
];

impl Table {
    fn new(name: &str) -> Result<Self, String> {
        let builtins: &[&str] = match name {
            "filter" => &["INPUT", "FORWARD", "OUTPUT"],
            "nat" => &["PREROUTING", "INPUT", "OUTPUT", "POSTROUTING"],
            "mangle" => &["PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"],
            "raw" => &["PREROUTING", "OUTPUT"],
            other => return Err(format!("can't initialize table `{other}'")),
        };
        Ok(Self {
            chains: builtins
                .iter()
                .map(|n| Chain {
                    name: (*n).to_owned(),
                    builtin: true,
                    rules: Vec::new(),
                })
                .collect(),
        })
    }

    fn chain(&mut self, name: &str) -> Result<&mut Chain, String> {
        self.chains
            .iter_mut()
            .find(|c| c.name == name)
            .ok_or_else(|| format!("chain `{name}' does not exist"))
    }

    fn has(&self, name: &str) -> bool {
        self.chains.iter().any(|c| c.name == name)
    }

    fn referenced(&self, name: &str) -> bool {
        self.chains
            .iter()
            .flat_map(|c| &c.rules)
            .any(|r| target(r) == Some(name))
    }

    fn is_touched(&self) -> bool {
        self.chains
            .iter()
            .any(|c| !c.builtin || !c.rules.is_empty())
    }

    fn check_rule(&self, rule: &[String]) -> Result<(), String> {
        match target(rule) {
            Some(t) if !TARGETS.contains(&t) && !self.has(t) => {
                Err(format!("Chain '{t}' does not exist"))
            }
            _ => Ok(()),
        }
    }

    fn print(&self, name: &str, out: &mut String) {
        out.push_str(&format!("*{name}\n"));
        let mut user: Vec<&Chain> = self.chains.iter().filter(|c| !c.builtin).collect();
        user.sort_by(|a, b| a.name.cmp(&b.name));
        for chain in self.chains.iter().filter(|c| c.builtin) {
            out.push_str(&format!(":{} ACCEPT [0:0]\n", chain.name));
        }
        for chain in &user {
            out.push_str(&format!(":{} - [0:0]\n", chain.name));
        }
        for chain in self.chains.iter().filter(|c| c.builtin).chain(user) {
            for rule in &chain.rules {
                out.push_str(&format!("-A {} {}\n", chain.name, quote(rule)));
            }
        }
        out.push_str("COMMIT\n");
    }

    /// Runs one command (`-A`, `-I`, `-D`, `-N`, `-X`, `-F`, `-S`); returns what it prints.
    fn command(&mut self, words: &[String]) -> Result<String, String> {
        let (flag, rest) = words.split_first().ok_or("no command")?;
        let chain = rest.first().map(String::as_str);
        let rule = rest.get(1..).unwrap_or_default();
        match (flag.as_str(), chain) {
            ("-N", Some(name)) => {
                if self.has(name) {
                    return Err("Chain already exists.".into());
                }
                self.chains.push(Chain {
                    name: name.to_owned(),
                    builtin: false,
                    rules: Vec::new(),
                });
            }
            ("-X", Some(name)) => {
                let found = self.chain(name)?;
                if found.builtin || !found.rules.is_empty() {
                    return Err(format!("chain `{name}' is built-in or not empty"));
                }
                if self.referenced(name) {
                    return Err(format!("chain `{name}' is referenced"));
                }
                self.chains.retain(|c| c.name != name);
            }
            ("-X", None) => {
                let user: Vec<String> = self
                    .chains
                    .iter()
                    .filter(|c| !c.builtin)
                    .map(|c| c.name.clone())
                    .collect();
                for name in user {
                    self.command(&["-X".to_owned(), name])?;
                }
            }
            ("-F", Some(name)) => self.chain(name)?.rules.clear(),
            ("-F", None) => self.chains.iter_mut().for_each(|c| c.rules.clear()),
            ("-A", Some(name)) => {
                self.check_rule(rule)?;
                self.chain(name)?.rules.push(rule.to_vec());
            }
            ("-I", Some(name)) => {
                let (at, rule) = match rule.split_first() {
                    Some((n, r)) if n.parse::<usize>().is_ok() => (n.parse().unwrap_or(1), r),
                    _ => (1, rule),
                };
                self.check_rule(rule)?;
                let rules = &mut self.chain(name)?.rules;
                if at == 0 || at > rules.len() + 1 {
                    return Err("Index of insertion too big.".into());
                }
                rules.insert(at - 1, rule.to_vec());
            }
            ("-D", Some(name)) => {
                let rules = &mut self.chain(name)?.rules;
                let index = match rule {
                    [n] if n.parse::<usize>().is_ok() => n.parse::<usize>().unwrap_or(0),
                    spec => rules.iter().position(|r| r == spec).map_or(0, |i| i + 1),
                };
                if index == 0 || index > rules.len() {
                    return Err("Index of deletion too big.".into());
                }
                rules.remove(index - 1);
            }
            ("-S", Some(name)) => {
                let chain = self.chain(name)?;
                let mut out = if chain.builtin {
                    format!("-P {name} ACCEPT\n")
                } else {
                    format!("-N {name}\n")
                };
                for rule in &chain.rules {
                    out.push_str(&format!("-A {name} {}\n", quote(rule)));
                }
                return Ok(out);
            }
            _ => return Err(format!("unsupported command {words:?}")),
        }
        Ok(String::new())
    }
}

fn target(rule: &[String]) -> Option<&str> {
    rule.windows(2)
        .rev()
        .find(|w| w[0] == "-j" || w[0] == "-g")
        .map(|w| w[1].as_str())
}

/// Words as iptables-save prints them: quoted only when they contain a space (as older
/// iptables versions do for comments; 1.8.9 always quotes comments).
fn quote(words: &[String]) -> String {
    words
        .iter()
        .map(|w| {
            if w.is_empty() || w.contains(' ') {
                format!("\"{}\"", w.replace('"', "\\\""))
            } else {
                w.clone()
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn exit(code: i32, stdout: String, stderr: String) -> CommandOutput {
    CommandOutput {
        code: Some(code),
        stdout,
        stderr,
    }
}

impl State {
    fn table(&mut self, family: Family, name: &str) -> Result<&mut Table, String> {
        let key = (family, name.to_owned());
        if !self.tables.contains_key(&key) {
            self.tables.insert(key.clone(), Table::new(name)?);
        }
        self.tables
            .get_mut(&key)
            .ok_or_else(|| "table vanished".to_owned())
    }

    fn save(&mut self, family: Family, table: Option<&str>) -> Result<String, String> {
        let mut out = String::from("# Generated by fake iptables-save\n");
        match table {
            Some(name) => self.table(family, name)?.print(name, &mut out),
            None => {
                for ((f, name), t) in &self.tables {
                    if *f == family && t.is_touched() {
                        t.print(name, &mut out);
                    }
                }
            }
        }
        Ok(out)
    }

    fn restore(&mut self, family: Family, program: &str, input: &str) -> CommandOutput {
        if self.failing_restores > 0 {
            self.failing_restores -= 1;
            return exit(
                1,
                String::new(),
                format!("{program}: line 1 failed: injected"),
            );
        }
        let mut open: Option<(String, Table)> = None;
        for (n, line) in input.lines().enumerate().map(|(i, l)| (i + 1, l.trim())) {
            let fail = |why: &str| {
                exit(
                    1,
                    String::new(),
                    format!("{program}: line {n} failed: {why}"),
                )
            };
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            if let Some(name) = line.strip_prefix('*') {
                match self.table(family, name) {
                    Ok(table) => open = Some((name.to_owned(), table.clone())),
                    Err(why) => return fail(&why),
                }
                continue;
            }
            let Some((name, table)) = open.as_mut() else {
                return fail("no table");
            };
            if line == "COMMIT" {
                let committed = table.clone();
                let key = (family, name.clone());
                self.tables.insert(key, committed);
                open = None;
                continue;
            }
            if let Some(declaration) = line.strip_prefix(':') {
                let Some(chain) = declaration.split_whitespace().next() else {
                    return fail("bad chain declaration");
                };
                match table.chain(chain) {
                    Ok(found) if !found.builtin => found.rules.clear(),
                    Ok(_) => {}
                    Err(_) => table.chains.push(Chain {
                        name: chain.to_owned(),
                        builtin: false,
                        rules: Vec::new(),
                    }),
                }
                continue;
            }
            if let Err(why) = table.command(&split_words(line)) {
                return fail(&why);
            }
        }
        if open.is_some() {
            return exit(1, String::new(), format!("{program}: COMMIT expected"));
        }
        exit(0, String::new(), String::new())
    }

    fn iptables(&mut self, family: Family, args: &[&str]) -> CommandOutput {
        let mut table = "filter";
        let mut words = Vec::new();
        let mut args = args.iter();
        while let Some(arg) = args.next() {
            match *arg {
                "-w" | "-W" => {
                    args.next();
                }
                "-t" => table = args.next().copied().unwrap_or("filter"),
                other => words.push(other.to_owned()),
            }
        }
        let result = self.table(family, table).and_then(|t| t.command(&words));
        match result {
            Ok(stdout) => exit(0, stdout, String::new()),
            Err(why) => exit(1, String::new(), format!("iptables: {why}")),
        }
    }

    fn conntrack(&mut self, args: &[&str]) -> CommandOutput {
        let mut family = Family::V4;
        let mut filters: Vec<(&str, &str)> = Vec::new();
        let mut command = "";
        let mut args = args.iter();
        while let Some(arg) = args.next() {
            match *arg {
                "-D" | "-L" => command = arg,
                "-f" => {
                    if args.next() == Some(&"ipv6") {
                        family = Family::V6;
                    }
                }
                "-p" => {
                    args.next();
                }
                flag => filters.push((flag, args.next().copied().unwrap_or_default())),
            }
        }
        let matches = |flow: &Flow| {
            (flow.orig_dst.is_ipv6() == (family == Family::V6))
                && filters.iter().all(|(flag, value)| {
                    let ip = |addr: IpAddr| value.parse::<IpAddr>().ok() == Some(addr);
                    let port = |p: u16| value.parse::<u16>().ok() == Some(p);
                    match *flag {
                        "--orig-src" => ip(flow.orig_src),
                        "--orig-dst" => ip(flow.orig_dst),
                        "--reply-src" => ip(flow.reply_src),
                        "--sport" => port(flow.sport),
                        "--dport" => port(flow.dport),
                        "--reply-port-src" => port(flow.reply_sport),
                        _ => false,
                    }
                })
        };
        let banner = "conntrack v1.4.7 (conntrack-tools)";
        match command {
            "-D" => {
                let before = self.flows.len();
                self.flows.retain(|f| !matches(f));
                let deleted = before - self.flows.len();
                exit(
                    i32::from(deleted == 0),
                    String::new(),
                    format!("{banner}: {deleted} flow entries have been deleted.\n"),
                )
            }
            "-L" => {
                let shown: Vec<String> = self
                    .flows
                    .iter()
                    .filter(|f| matches(f))
                    .map(|f| {
                        format!(
                            "udp      17 29 src={} dst={} sport={} dport={} src={} dst={} sport={} dport={} mark=0 use=1\n",
                            f.orig_src, f.orig_dst, f.sport, f.dport, f.reply_src, f.orig_src, f.reply_sport, f.sport
                        )
                    })
                    .collect();
                let count = shown.len();
                exit(
                    0,
                    shown.concat(),
                    format!("{banner}: {count} flow entries have been shown.\n"),
                )
            }
            _ => exit(2, String::new(), format!("{banner}: unsupported {command}")),
        }
    }
}

impl FakeKernel {
    /// An empty kernel: built-in chains only.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Sets a sysctl's value as the kernel would report it.
    pub fn set_sysctl(&self, name: &str, value: &str) {
        self.lock()
            .sysctls
            .insert(name.to_owned(), value.to_owned());
    }

    /// A sysctl's value, if set (by the test or by the agent).
    #[must_use]
    pub fn sysctl(&self, name: &str) -> Option<String> {
        self.lock().sysctls.get(name).cloned()
    }

    /// Every call so far.
    #[must_use]
    pub fn calls(&self) -> Vec<Call> {
        self.lock().calls.clone()
    }

    /// Every call so far, forgetting them.
    pub fn take_calls(&self) -> Vec<Call> {
        std::mem::take(&mut self.lock().calls)
    }

    /// What `iptables-save -t TABLE` prints for `family`.
    #[must_use]
    pub fn save(&self, family: Family, table: &str) -> String {
        self.lock()
            .save(family, Some(table))
            .unwrap_or_else(|why| why)
    }

    /// Runs an `iptables` command as someone else on the node would, e.g.
    /// `-t nat -F PROXYPLAN-CANARY`.
    ///
    /// # Errors
    /// What iptables would print.
    pub fn iptables(&self, family: Family, command: &str) -> Result<String, String> {
        let words = split_words(command);
        let args: Vec<&str> = words.iter().map(String::as_str).collect();
        let out = self.lock().iptables(family, &args);
        if out.success() {
            Ok(out.stdout)
        } else {
            Err(out.stderr)
        }
    }

    /// Adds a UDP conntrack entry.
    pub fn add_flow(&self, flow: Flow) {
        self.lock().flows.push(flow);
    }

    /// The UDP conntrack entries.
    #[must_use]
    pub fn flows(&self) -> Vec<Flow> {
        self.lock().flows.clone()
    }

    /// Makes the next `n` restores fail.
    pub fn fail_restores(&self, n: usize) {
        self.lock().failing_restores = n;
    }

    /// Makes `program` missing.
    pub fn remove_program(&self, program: &str) {
        self.lock().missing.insert(program.to_owned());
    }
}

impl Runner for FakeKernel {
    fn read_sysctl(&self, name: &str) -> Result<Option<String>, DataplaneError> {
        Ok(self.sysctl(name))
    }

    fn write_sysctl(&self, name: &str, value: &str) -> Result<(), DataplaneError> {
        self.set_sysctl(name, value);
        Ok(())
    }

    fn run(
        &self,
        program: &str,
        args: &[&str],
        stdin: Option<&str>,
    ) -> Result<CommandOutput, DataplaneError> {
        let mut state = self.lock();
        state.calls.push(Call {
            program: program.to_owned(),
            args: args.iter().map(|a| (*a).to_owned()).collect(),
            stdin: stdin.map(str::to_owned),
        });
        if state.missing.contains(program) {
            return Err(DataplaneError::MissingTool {
                tool: program.to_owned(),
                hint: format!("Debian package {}", package_of(program)),
            });
        }
        let family = if program.starts_with("ip6tables") {
            Family::V6
        } else {
            Family::V4
        };
        Ok(if program == "conntrack" {
            state.conntrack(args)
        } else if program.ends_with("-save") {
            let table = args
                .iter()
                .position(|a| *a == "-t")
                .and_then(|i| args.get(i + 1))
                .copied();
            match state.save(family, table) {
                Ok(text) => exit(0, text, String::new()),
                Err(why) => exit(1, String::new(), why),
            }
        } else if program.ends_with("-restore") {
            state.restore(family, program, stdin.unwrap_or_default())
        } else if program.contains("iptables") {
            state.iptables(family, args)
        } else {
            return Err(DataplaneError::MissingTool {
                tool: program.to_owned(),
                hint: "not simulated by the fake kernel".into(),
            });
        })
    }
}
