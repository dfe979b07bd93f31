//! What `iptables-nft` keeps in nf_tables, read over nfnetlink without the `iptables-nft`
//! tools: each chain of a table (`ip nat`, `ip6 filter`, ...) and, for each rule, only
//! what the agent compares (its chain, its comment, whether it is nothing but that
//! comment, the chain it jumps or goes to).
//!
//! `iptables-nft-save` holds the whole ruleset in memory and, at 10,000 Services,
//! crashes in libnftnl; a dump over netlink streams the same rules in a fraction of the
//! time, and the reader keeps none of them.
//!
//! Message layout (`linux/netfilter/nf_tables.h`): an `nfgenmsg` (family, version,
//! resource id) and attributes. A rule carries `NFTA_RULE_CHAIN` and a list of
//! expressions; `iptables-nft` 1.8 writes `-m comment` as an `xt` `match` expression
//! named `comment` whose info is the text (later versions may keep the comment in the
//! rule's user data instead: both are read), `-j CHAIN` / `-g CHAIN` as an `immediate`
//! verdict, and a `counter` in every rule.

use std::io;

use super::family::Family;
use super::netlink::frame::{
    NLM_F_DUMP, NLM_F_REQUEST, NetlinkHeader, attributes, finish_message, put_string, start_message,
};
use super::netlink::socket::{NetlinkSocket, RawMessage};

/// `NETLINK_NETFILTER`.
const NETLINK_NETFILTER: isize = 12;
/// `NFNL_SUBSYS_NFTABLES`.
const NFNL_SUBSYS_NFTABLES: u16 = 10;
const NFT_MSG_GETCHAIN: u16 = 4;
const NFT_MSG_GETRULE: u16 = 7;
const NFT_MSG_GETGEN: u16 = 16;
const NFPROTO_IPV4: u8 = 2;
const NFPROTO_IPV6: u8 = 10;
/// `ENOENT`.
const ENOENT: i32 = 2;
/// Bytes of `struct nfgenmsg`.
const NFGENMSG_LEN: usize = 4;

const NFTA_CHAIN_TABLE: u16 = 1;
const NFTA_CHAIN_NAME: u16 = 3;
const NFTA_CHAIN_HOOK: u16 = 4;
const NFTA_RULE_TABLE: u16 = 1;
const NFTA_RULE_CHAIN: u16 = 2;
const NFTA_RULE_EXPRESSIONS: u16 = 4;
const NFTA_RULE_USERDATA: u16 = 7;
const NFTA_LIST_ELEM: u16 = 1;
const NFTA_EXPR_NAME: u16 = 1;
const NFTA_EXPR_DATA: u16 = 2;
const NFTA_MATCH_NAME: u16 = 1;
const NFTA_MATCH_INFO: u16 = 3;
const NFTA_IMMEDIATE_DATA: u16 = 2;
const NFTA_DATA_VERDICT: u16 = 2;
const NFTA_VERDICT_CODE: u16 = 1;
const NFTA_VERDICT_CHAIN: u16 = 2;
const NFTA_GEN_ID: u16 = 1;
/// `NFTNL_UDATA_RULE_COMMENT`: libnftnl's type-length-value record of a rule comment.
const UDATA_RULE_COMMENT: u8 = 0;
/// `NFT_JUMP` and `NFT_GOTO`, as the `u32` the kernel sends.
const NFT_JUMP: u32 = (-3i32).cast_unsigned();
const NFT_GOTO: u32 = (-4i32).cast_unsigned();

/// One chain of the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NftChain<'a> {
    /// Its name.
    pub name: &'a str,
    /// Whether it is a base chain (hooked: `PREROUTING`, `INPUT`, ...).
    pub base: bool,
}

/// One rule of the table, reduced to what the agent compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NftRule<'a> {
    /// The chain it is in.
    pub chain: &'a str,
    /// Its (first) comment.
    pub comment: Option<&'a str>,
    /// Whether it is nothing but that comment (and a counter): `-m comment --comment X`
    /// alone, as the agent's revision rules are.
    pub comment_only: bool,
    /// The chain it jumps (`-j`) or goes (`-g`) to.
    pub target: Option<&'a str>,
}

/// What a table dump saw besides its chains and rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DumpSummary {
    /// Whether the table exists.
    pub exists: bool,
    /// The nf_tables generation when the dump started: it changes with every commit
    /// to nf_tables in the network namespace, by anyone.
    pub generation: u32,
    /// Whether nothing was committed to nf_tables while the table was read, so it is
    /// one consistent snapshot.
    pub consistent: bool,
    /// Bytes of netlink messages read.
    pub bytes: usize,
}

/// Reads of a table that changed while it was read before one is given up as
/// inconsistent (and used all the same: the next check reads again).
pub const ATTEMPTS: usize = 3;

/// A netlink socket for reading what `iptables-nft` left in nf_tables.
#[derive(Debug)]
pub struct XtablesNft {
    socket: NetlinkSocket,
}

fn nfproto(family: Family) -> u8 {
    match family {
        Family::V4 => NFPROTO_IPV4,
        Family::V6 => NFPROTO_IPV6,
    }
}

fn request(command: u16, flags: u16, family: u8, fill: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    let mut buf = start_message(&NetlinkHeader {
        message_type: (NFNL_SUBSYS_NFTABLES << 8) | command,
        flags: NLM_F_REQUEST | flags,
        seq: 0,
        port_id: 0,
    });
    // nfgenmsg: family, version 0, resource id 0.
    buf.extend_from_slice(&[family, 0, 0, 0]);
    fill(&mut buf);
    finish_message(buf)
}

/// A message's attributes (after the `nlmsghdr` and the `nfgenmsg`).
fn payload<'a>(message: &RawMessage<'a>) -> &'a [u8] {
    message.bytes.get(16 + NFGENMSG_LEN..).unwrap_or_default()
}

/// A NUL-terminated (or unterminated) string attribute, borrowed.
fn text(value: &[u8]) -> Option<&str> {
    let end = value.iter().position(|&b| b == 0).unwrap_or(value.len());
    std::str::from_utf8(value.get(..end)?).ok()
}

/// The attributes of `buf` (a message's or a nest's); a malformed one ends the walk.
fn attrs(buf: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    attributes(buf)
        .map_while(Result::ok)
        .map(|a| (a.kind, a.value))
}

fn find(buf: &[u8], kind: u16) -> Option<&[u8]> {
    attrs(buf).find(|(k, _)| *k == kind).map(|(_, v)| v)
}

/// Reads one `NFT_MSG_NEWCHAIN` of a dump.
fn decode_chain<'a>(message: &RawMessage<'a>, table: &str) -> Option<NftChain<'a>> {
    let body = payload(message);
    if find(body, NFTA_CHAIN_TABLE).and_then(text) != Some(table) {
        return None;
    }
    Some(NftChain {
        name: find(body, NFTA_CHAIN_NAME).and_then(text)?,
        base: find(body, NFTA_CHAIN_HOOK).is_some(),
    })
}

/// Reads one `NFT_MSG_NEWRULE` of a dump.
fn decode_rule<'a>(message: &RawMessage<'a>) -> Option<NftRule<'a>> {
    let body = payload(message);
    let mut rule = NftRule {
        chain: "",
        comment: None,
        comment_only: true,
        target: None,
    };
    let mut comments = 0;
    for (kind, value) in attrs(body) {
        match kind {
            NFTA_RULE_CHAIN => rule.chain = text(value)?,
            NFTA_RULE_USERDATA => {
                if let Some(comment) = udata_comment(value) {
                    comments += 1;
                    rule.comment.get_or_insert(comment);
                }
            }
            NFTA_RULE_EXPRESSIONS => {
                for (_, element) in attrs(value).filter(|(k, _)| *k == NFTA_LIST_ELEM) {
                    let name = find(element, NFTA_EXPR_NAME).and_then(text).unwrap_or("");
                    let data = find(element, NFTA_EXPR_DATA).unwrap_or_default();
                    match name {
                        "counter" => {}
                        "match"
                            if find(data, NFTA_MATCH_NAME).and_then(text) == Some("comment") =>
                        {
                            comments += 1;
                            if let Some(comment) = find(data, NFTA_MATCH_INFO).and_then(text) {
                                rule.comment.get_or_insert(comment);
                            }
                        }
                        "immediate" => {
                            rule.target = rule.target.or_else(|| verdict_chain(data));
                            rule.comment_only = false;
                        }
                        _ => rule.comment_only = false,
                    }
                }
            }
            _ => {}
        }
    }
    rule.comment_only &= comments == 1;
    (!rule.chain.is_empty()).then_some(rule)
}

/// The chain of an `immediate` expression's jump or goto verdict.
fn verdict_chain(data: &[u8]) -> Option<&str> {
    let verdict = find(find(data, NFTA_IMMEDIATE_DATA)?, NFTA_DATA_VERDICT)?;
    let code = find(verdict, NFTA_VERDICT_CODE)?;
    let code = u32::from_be_bytes(code.try_into().ok()?);
    if code != NFT_JUMP && code != NFT_GOTO {
        return None;
    }
    find(verdict, NFTA_VERDICT_CHAIN).and_then(text)
}

/// The comment record of a rule's user data (`type u8, length u8, value`, repeated).
fn udata_comment(udata: &[u8]) -> Option<&str> {
    let mut rest = udata;
    while let [kind, len, tail @ ..] = rest {
        let len = usize::from(*len);
        let value = tail.get(..len)?;
        if *kind == UDATA_RULE_COMMENT {
            return text(value);
        }
        rest = tail.get(len..)?;
    }
    None
}

impl XtablesNft {
    /// Opens an nfnetlink socket in the calling thread's network namespace.
    ///
    /// # Errors
    /// When the socket cannot be opened.
    pub fn open() -> io::Result<Self> {
        Ok(Self {
            socket: NetlinkSocket::open(NETLINK_NETFILTER)?,
        })
    }

    /// The nf_tables generation: it changes with every commit, by anyone, to any
    /// table of the network namespace.
    ///
    /// # Errors
    /// When the kernel cannot be asked.
    pub fn generation(&mut self) -> io::Result<u32> {
        let answer = self.socket.request(request(NFT_MSG_GETGEN, 0, 0, |_| {}))?;
        let body = answer.get(16 + NFGENMSG_LEN..).unwrap_or_default();
        find(body, NFTA_GEN_ID)
            .and_then(|v| v.try_into().ok())
            .map(u32::from_be_bytes)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "no NFTA_GEN_ID"))
    }

    /// Every chain, then every rule (chain by chain, each in order), of `family`'s
    /// `table`. The rules are dumped one chain at a time: the kernel resumes a dump of
    /// a whole table by walking it again from the start for every message buffer, which
    /// is quadratic (90 s for the 570,000 rules of 10,000 Services), while a dump of
    /// one chain finds the chain by its hash.
    ///
    /// The read is repeated (after `restart`) when nf_tables changed while it ran, up
    /// to [`ATTEMPTS`] times; the summary says whether the last one was consistent.
    ///
    /// # Errors
    /// When the socket fails or the kernel refuses.
    pub fn dump_table(
        &mut self,
        family: Family,
        table: &str,
        chain: &mut dyn FnMut(NftChain<'_>),
        rule: &mut dyn FnMut(NftRule<'_>),
        restart: &mut dyn FnMut(),
    ) -> io::Result<DumpSummary> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            let summary = self.dump_once(family, table, chain, rule)?;
            if summary.consistent || attempt == ATTEMPTS {
                return Ok(summary);
            }
            restart();
        }
    }

    fn dump_once(
        &mut self,
        family: Family,
        table: &str,
        chain: &mut dyn FnMut(NftChain<'_>),
        rule: &mut dyn FnMut(NftRule<'_>),
    ) -> io::Result<DumpSummary> {
        let generation = self.generation()?;
        let mut summary = DumpSummary {
            exists: false,
            generation,
            consistent: true,
            bytes: 0,
        };
        // The table's chain names, back to back.
        let mut names = String::new();
        let mut ends = Vec::new();
        let chains = request(NFT_MSG_GETCHAIN, NLM_F_DUMP, nfproto(family), |_| {});
        let mut interrupted = self.socket.dump_each(chains, &mut |message| {
            summary.bytes += message.bytes.len();
            if let Some(found) = decode_chain(&message, table) {
                names.push_str(found.name);
                ends.push(names.len());
                chain(found);
            }
        })?;
        summary.exists = !ends.is_empty();
        let mut start = 0;
        for end in ends {
            let name = names.get(start..end).unwrap_or_default();
            start = end;
            let rules = request(NFT_MSG_GETRULE, NLM_F_DUMP, nfproto(family), |buf| {
                put_string(buf, NFTA_RULE_TABLE, table);
                put_string(buf, NFTA_RULE_CHAIN, name);
            });
            interrupted |= match self.socket.dump_each(rules, &mut |message| {
                summary.bytes += message.bytes.len();
                if let Some(found) = decode_rule(&message) {
                    rule(found);
                }
            }) {
                Ok(interrupted) => interrupted,
                // The chain (or table) went away since the chains were listed.
                Err(err) if err.raw_os_error() == Some(ENOENT) => true,
                Err(err) => return Err(err),
            };
        }
        summary.consistent = !interrupted && self.generation()? == generation;
        Ok(summary)
    }
}

#[cfg(all(test, target_endian = "little"))]
mod tests {
    use super::*;
    use crate::kernel::netlink::frame::{put_nest, put_u32};

    fn message(command: u16, fill: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
        request(command, 0x2, NFPROTO_IPV4, fill)
    }

    fn raw(bytes: &[u8]) -> RawMessage<'_> {
        RawMessage {
            message_type: u16::from_ne_bytes([bytes[4], bytes[5]]),
            flags: u16::from_ne_bytes([bytes[6], bytes[7]]),
            seq: 0,
            bytes,
        }
    }

    fn expression(buf: &mut Vec<u8>, name: &str, data: impl FnOnce(&mut Vec<u8>)) {
        put_nest(buf, NFTA_LIST_ELEM, |e| {
            put_string(e, NFTA_EXPR_NAME, name);
            put_nest(e, NFTA_EXPR_DATA, data);
        });
    }

    fn comment(buf: &mut Vec<u8>, text: &str) {
        expression(buf, "match", |d| {
            put_string(d, NFTA_MATCH_NAME, "comment");
            put_u32(d, 2, 0);
            let mut info = text.as_bytes().to_vec();
            info.resize(256, 0);
            crate::kernel::netlink::frame::put_attr(d, NFTA_MATCH_INFO, &info);
        });
    }

    fn jump(buf: &mut Vec<u8>, code: i32, chain: &str) {
        expression(buf, "immediate", |d| {
            put_u32(d, 1, 0);
            put_nest(d, NFTA_IMMEDIATE_DATA, |v| {
                put_nest(v, NFTA_DATA_VERDICT, |v| {
                    crate::kernel::netlink::frame::put_attr(
                        v,
                        NFTA_VERDICT_CODE,
                        &code.to_be_bytes(),
                    );
                    put_string(v, NFTA_VERDICT_CHAIN, chain);
                });
            });
        });
    }

    #[test]
    fn a_revision_rule_is_a_comment_alone() {
        let bytes = message(6, |b| {
            put_string(b, NFTA_RULE_TABLE, "nat");
            put_string(b, NFTA_RULE_CHAIN, "PP-SVC-A");
            put_nest(b, NFTA_RULE_EXPRESSIONS, |l| {
                comment(l, "proxyplan-rev:0123456789abcdef");
                expression(l, "counter", |_| {});
            });
        });
        let rule = decode_rule(&raw(&bytes));
        assert_eq!(
            rule,
            Some(NftRule {
                chain: "PP-SVC-A",
                comment: Some("proxyplan-rev:0123456789abcdef"),
                comment_only: true,
                target: None,
            })
        );
    }

    #[test]
    fn a_jump_with_a_comment_is_read_with_its_target() {
        for (code, target) in [(-3, Some("PP-SEP-B")), (-4, Some("PP-SEP-B")), (-1, None)] {
            let bytes = message(6, |b| {
                put_string(b, NFTA_RULE_CHAIN, "PP-SVC-A");
                put_nest(b, NFTA_RULE_EXPRESSIONS, |l| {
                    comment(l, "default/web:http");
                    expression(l, "match", |d| put_string(d, NFTA_MATCH_NAME, "statistic"));
                    expression(l, "counter", |_| {});
                    jump(l, code, "PP-SEP-B");
                });
            });
            let rule = decode_rule(&raw(&bytes)).expect("a rule");
            assert_eq!(rule.target, target, "verdict {code}");
            assert_eq!(rule.comment, Some("default/web:http"));
            assert!(!rule.comment_only);
        }
    }

    #[test]
    fn a_comment_in_user_data_counts_too() {
        let bytes = message(6, |b| {
            put_string(b, NFTA_RULE_CHAIN, "PP-SVC-A");
            put_nest(b, NFTA_RULE_EXPRESSIONS, |l| {
                expression(l, "counter", |_| {})
            });
            let mut udata = vec![UDATA_RULE_COMMENT, 4];
            udata.extend_from_slice(b"abc\0");
            crate::kernel::netlink::frame::put_attr(b, NFTA_RULE_USERDATA, &udata);
        });
        let rule = decode_rule(&raw(&bytes)).expect("a rule");
        assert_eq!((rule.comment, rule.comment_only), (Some("abc"), true));
        // A rule without any comment is not a comment alone.
        let bare = message(6, |b| {
            put_string(b, NFTA_RULE_CHAIN, "PP-SVC-A");
            put_nest(b, NFTA_RULE_EXPRESSIONS, |l| {
                expression(l, "counter", |_| {})
            });
        });
        let rule = decode_rule(&raw(&bare)).expect("a rule");
        assert_eq!((rule.comment, rule.comment_only), (None, false));
    }

    #[test]
    fn chains_of_other_tables_are_skipped_and_base_chains_known() {
        let base = message(3, |b| {
            put_string(b, NFTA_CHAIN_TABLE, "nat");
            put_string(b, NFTA_CHAIN_NAME, "PREROUTING");
            put_nest(b, NFTA_CHAIN_HOOK, |h| put_u32(h, 1, 0));
        });
        let other = message(3, |b| {
            put_string(b, NFTA_CHAIN_TABLE, "filter");
            put_string(b, NFTA_CHAIN_NAME, "INPUT");
        });
        assert_eq!(
            decode_chain(&raw(&base), "nat"),
            Some(NftChain {
                name: "PREROUTING",
                base: true
            })
        );
        assert_eq!(decode_chain(&raw(&other), "nat"), None);
    }
}
