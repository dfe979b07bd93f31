//! Constants of nf_tables over nfnetlink, named after their definitions in
//! `include/uapi/linux/netfilter/nf_tables.h`, `nfnetlink.h`, `nf_nat.h` and
//! `netfilter.h`. Every `u32`, `u64` and `u16` attribute value of nf_tables is
//! big-endian; the flag `NLA_F_NET_BYTEORDER` is not used on them.

#![allow(
    missing_docs,
    reason = "each constant is named after its uapi definition"
)]

// ---- nfnetlink.h -----------------------------------------------------------------------

/// `NFNL_SUBSYS_NFTABLES`: the high byte of every nf_tables message type.
pub const NFNL_SUBSYS_NFTABLES: u8 = 10;
/// `NFNL_MSG_BATCH_BEGIN` (`NLMSG_MIN_TYPE`): opens a transaction.
pub const NFNL_MSG_BATCH_BEGIN: u16 = 0x10;
/// `NFNL_MSG_BATCH_END`: commits it.
pub const NFNL_MSG_BATCH_END: u16 = 0x11;
/// `NFNL_BATCH_GENID`: in the batch begin, the generation the batch was built against.
pub const NFNL_BATCH_GENID: u16 = 1;
/// `NFNETLINK_V0`.
pub const NFNETLINK_V0: u8 = 0;

// ---- netfilter.h -----------------------------------------------------------------------

pub const NFPROTO_UNSPEC: u8 = 0;
pub const NFPROTO_IPV4: u8 = 2;
pub const NFPROTO_IPV6: u8 = 10;

pub const NF_INET_PRE_ROUTING: u32 = 0;
pub const NF_INET_LOCAL_IN: u32 = 1;
pub const NF_INET_FORWARD: u32 = 2;
pub const NF_INET_LOCAL_OUT: u32 = 3;
pub const NF_INET_POST_ROUTING: u32 = 4;

pub const NF_ACCEPT: i32 = 1;
pub const NF_DROP: i32 = 0;

// ---- nf_tables.h: messages -------------------------------------------------------------

pub const NFT_MSG_NEWTABLE: u8 = 0;
pub const NFT_MSG_GETTABLE: u8 = 1;
pub const NFT_MSG_DELTABLE: u8 = 2;
pub const NFT_MSG_NEWCHAIN: u8 = 3;
pub const NFT_MSG_GETCHAIN: u8 = 4;
pub const NFT_MSG_DELCHAIN: u8 = 5;
pub const NFT_MSG_NEWRULE: u8 = 6;
pub const NFT_MSG_GETRULE: u8 = 7;
pub const NFT_MSG_DELRULE: u8 = 8;
pub const NFT_MSG_NEWSET: u8 = 9;
pub const NFT_MSG_GETSET: u8 = 10;
pub const NFT_MSG_DELSET: u8 = 11;
pub const NFT_MSG_NEWSETELEM: u8 = 12;
pub const NFT_MSG_GETSETELEM: u8 = 13;
pub const NFT_MSG_DELSETELEM: u8 = 14;
pub const NFT_MSG_NEWGEN: u8 = 15;
pub const NFT_MSG_GETGEN: u8 = 16;

pub const NFT_NAME_MAXLEN: usize = 256;
pub const NFT_USERDATA_MAXLEN: usize = 256;

// ---- registers and verdicts -------------------------------------------------------------

pub const NFT_REG_VERDICT: u32 = 0;
pub const NFT_REG_1: u32 = 1;
pub const NFT_REG32_00: u32 = 8;
pub const NFT_REG32_15: u32 = 23;

pub const NFT_CONTINUE: i32 = -1;
pub const NFT_BREAK: i32 = -2;
pub const NFT_JUMP: i32 = -3;
pub const NFT_GOTO: i32 = -4;
pub const NFT_RETURN: i32 = -5;

// ---- attributes ---------------------------------------------------------------------------

pub const NFTA_LIST_ELEM: u16 = 1;

pub const NFTA_HOOK_HOOKNUM: u16 = 1;
pub const NFTA_HOOK_PRIORITY: u16 = 2;

pub const NFTA_TABLE_NAME: u16 = 1;
pub const NFTA_TABLE_FLAGS: u16 = 2;
pub const NFTA_TABLE_USE: u16 = 3;
pub const NFTA_TABLE_HANDLE: u16 = 4;
pub const NFTA_TABLE_USERDATA: u16 = 6;

pub const NFTA_CHAIN_TABLE: u16 = 1;
pub const NFTA_CHAIN_HANDLE: u16 = 2;
pub const NFTA_CHAIN_NAME: u16 = 3;
pub const NFTA_CHAIN_HOOK: u16 = 4;
pub const NFTA_CHAIN_POLICY: u16 = 5;
pub const NFTA_CHAIN_USE: u16 = 6;
pub const NFTA_CHAIN_TYPE: u16 = 7;
pub const NFTA_CHAIN_COUNTERS: u16 = 8;
pub const NFTA_CHAIN_FLAGS: u16 = 10;
pub const NFTA_CHAIN_USERDATA: u16 = 12;

pub const NFTA_RULE_TABLE: u16 = 1;
pub const NFTA_RULE_CHAIN: u16 = 2;
pub const NFTA_RULE_HANDLE: u16 = 3;
pub const NFTA_RULE_EXPRESSIONS: u16 = 4;
pub const NFTA_RULE_POSITION: u16 = 6;
pub const NFTA_RULE_USERDATA: u16 = 7;

pub const NFT_SET_ANONYMOUS: u32 = 0x1;
pub const NFT_SET_CONSTANT: u32 = 0x2;
pub const NFT_SET_INTERVAL: u32 = 0x4;
pub const NFT_SET_MAP: u32 = 0x8;
pub const NFT_SET_TIMEOUT: u32 = 0x10;
pub const NFT_SET_EVAL: u32 = 0x20;
pub const NFT_SET_CONCAT: u32 = 0x80;

pub const NFTA_SET_DESC_SIZE: u16 = 1;
pub const NFTA_SET_DESC_CONCAT: u16 = 2;
pub const NFTA_SET_FIELD_LEN: u16 = 1;

pub const NFTA_SET_TABLE: u16 = 1;
pub const NFTA_SET_NAME: u16 = 2;
pub const NFTA_SET_FLAGS: u16 = 3;
pub const NFTA_SET_KEY_TYPE: u16 = 4;
pub const NFTA_SET_KEY_LEN: u16 = 5;
pub const NFTA_SET_DATA_TYPE: u16 = 6;
pub const NFTA_SET_DATA_LEN: u16 = 7;
pub const NFTA_SET_POLICY: u16 = 8;
pub const NFTA_SET_DESC: u16 = 9;
pub const NFTA_SET_ID: u16 = 10;
pub const NFTA_SET_TIMEOUT: u16 = 11;
pub const NFTA_SET_GC_INTERVAL: u16 = 12;
pub const NFTA_SET_USERDATA: u16 = 13;
pub const NFTA_SET_HANDLE: u16 = 16;

pub const NFTA_SET_ELEM_KEY: u16 = 1;
pub const NFTA_SET_ELEM_DATA: u16 = 2;
pub const NFTA_SET_ELEM_FLAGS: u16 = 3;
pub const NFTA_SET_ELEM_TIMEOUT: u16 = 4;
pub const NFTA_SET_ELEM_EXPIRATION: u16 = 5;
pub const NFTA_SET_ELEM_USERDATA: u16 = 6;

pub const NFTA_SET_ELEM_LIST_TABLE: u16 = 1;
pub const NFTA_SET_ELEM_LIST_SET: u16 = 2;
pub const NFTA_SET_ELEM_LIST_ELEMENTS: u16 = 3;
pub const NFTA_SET_ELEM_LIST_SET_ID: u16 = 4;

/// `NFT_DATA_VERDICT`: the data type of a verdict map.
pub const NFT_DATA_VERDICT: u32 = 0xffff_ff00;
pub const NFTA_DATA_VALUE: u16 = 1;
pub const NFTA_DATA_VERDICT: u16 = 2;
pub const NFTA_VERDICT_CODE: u16 = 1;
pub const NFTA_VERDICT_CHAIN: u16 = 2;

pub const NFTA_EXPR_NAME: u16 = 1;
pub const NFTA_EXPR_DATA: u16 = 2;

pub const NFTA_IMMEDIATE_DREG: u16 = 1;
pub const NFTA_IMMEDIATE_DATA: u16 = 2;

pub const NFT_BITWISE_MASK_XOR: u32 = 0;
pub const NFTA_BITWISE_SREG: u16 = 1;
pub const NFTA_BITWISE_DREG: u16 = 2;
pub const NFTA_BITWISE_LEN: u16 = 3;
pub const NFTA_BITWISE_MASK: u16 = 4;
pub const NFTA_BITWISE_XOR: u16 = 5;
pub const NFTA_BITWISE_OP: u16 = 6;

pub const NFT_CMP_EQ: u32 = 0;
pub const NFT_CMP_NEQ: u32 = 1;
pub const NFTA_CMP_SREG: u16 = 1;
pub const NFTA_CMP_OP: u16 = 2;
pub const NFTA_CMP_DATA: u16 = 3;

pub const NFT_LOOKUP_F_INV: u32 = 1;
pub const NFTA_LOOKUP_SET: u16 = 1;
pub const NFTA_LOOKUP_SREG: u16 = 2;
pub const NFTA_LOOKUP_DREG: u16 = 3;
pub const NFTA_LOOKUP_SET_ID: u16 = 4;
pub const NFTA_LOOKUP_FLAGS: u16 = 5;

pub const NFT_DYNSET_OP_ADD: u32 = 0;
pub const NFT_DYNSET_OP_UPDATE: u32 = 1;
pub const NFT_DYNSET_OP_DELETE: u32 = 2;
pub const NFTA_DYNSET_SET_NAME: u16 = 1;
pub const NFTA_DYNSET_SET_ID: u16 = 2;
pub const NFTA_DYNSET_OP: u16 = 3;
pub const NFTA_DYNSET_SREG_KEY: u16 = 4;
pub const NFTA_DYNSET_SREG_DATA: u16 = 5;
pub const NFTA_DYNSET_TIMEOUT: u16 = 6;
pub const NFTA_DYNSET_FLAGS: u16 = 9;

pub const NFT_PAYLOAD_LL_HEADER: u32 = 0;
pub const NFT_PAYLOAD_NETWORK_HEADER: u32 = 1;
pub const NFT_PAYLOAD_TRANSPORT_HEADER: u32 = 2;
pub const NFTA_PAYLOAD_DREG: u16 = 1;
pub const NFTA_PAYLOAD_BASE: u16 = 2;
pub const NFTA_PAYLOAD_OFFSET: u16 = 3;
pub const NFTA_PAYLOAD_LEN: u16 = 4;

pub const NFT_META_MARK: u32 = 3;
pub const NFT_META_IIFNAME: u32 = 6;
pub const NFT_META_OIFNAME: u32 = 7;
pub const NFT_META_NFPROTO: u32 = 15;
pub const NFT_META_L4PROTO: u32 = 16;
pub const NFTA_META_DREG: u16 = 1;
pub const NFTA_META_KEY: u16 = 2;
pub const NFTA_META_SREG: u16 = 3;

pub const NFT_CT_STATE: u32 = 0;
pub const NFT_CT_STATUS: u32 = 2;
pub const NFTA_CT_DREG: u16 = 1;
pub const NFTA_CT_KEY: u16 = 2;
pub const NFTA_CT_DIRECTION: u16 = 3;

/// `NF_CT_STATE_BIT(IP_CT_NEW)`: `ct state new`.
pub const NF_CT_STATE_NEW_BIT: u32 = 1 << 3;
/// `NF_CT_STATE_INVALID_BIT`: `ct state invalid`.
pub const NF_CT_STATE_INVALID_BIT: u32 = 1;
/// `IPS_DST_NAT`: `ct status dnat`.
pub const IPS_DST_NAT: u32 = 1 << 5;

pub const NFT_NG_INCREMENTAL: u32 = 0;
pub const NFT_NG_RANDOM: u32 = 1;
pub const NFTA_NG_DREG: u16 = 1;
pub const NFTA_NG_MODULUS: u16 = 2;
pub const NFTA_NG_TYPE: u16 = 3;
pub const NFTA_NG_OFFSET: u16 = 4;

pub const NFT_NAT_SNAT: u32 = 0;
pub const NFT_NAT_DNAT: u32 = 1;
pub const NFTA_NAT_TYPE: u16 = 1;
pub const NFTA_NAT_FAMILY: u16 = 2;
pub const NFTA_NAT_REG_ADDR_MIN: u16 = 3;
pub const NFTA_NAT_REG_ADDR_MAX: u16 = 4;
pub const NFTA_NAT_REG_PROTO_MIN: u16 = 5;
pub const NFTA_NAT_REG_PROTO_MAX: u16 = 6;
pub const NFTA_NAT_FLAGS: u16 = 7;

pub const NF_NAT_RANGE_MAP_IPS: u32 = 1 << 0;
pub const NF_NAT_RANGE_PROTO_SPECIFIED: u32 = 1 << 1;
pub const NF_NAT_RANGE_PROTO_RANDOM_FULLY: u32 = 1 << 4;

pub const NFTA_MASQ_FLAGS: u16 = 1;
pub const NFTA_MASQ_REG_PROTO_MIN: u16 = 2;
pub const NFTA_MASQ_REG_PROTO_MAX: u16 = 3;

pub const NFT_REJECT_ICMP_UNREACH: u32 = 0;
pub const NFT_REJECT_TCP_RST: u32 = 1;
pub const NFT_REJECT_ICMPX_UNREACH: u32 = 2;
pub const NFTA_REJECT_TYPE: u16 = 1;
pub const NFTA_REJECT_ICMP_CODE: u16 = 2;
/// `ICMP_PORT_UNREACH`.
pub const ICMP_PORT_UNREACH: u8 = 3;
/// `ICMPV6_PORT_UNREACH`.
pub const ICMPV6_PORT_UNREACH: u8 = 4;

pub const NFT_FIB_RESULT_ADDRTYPE: u32 = 3;
pub const NFTA_FIB_DREG: u16 = 1;
pub const NFTA_FIB_RESULT: u16 = 2;
pub const NFTA_FIB_FLAGS: u16 = 3;
pub const NFTA_FIB_F_SADDR: u32 = 1 << 0;
pub const NFTA_FIB_F_DADDR: u32 = 1 << 1;
/// `RTN_LOCAL`: `fib ... type local`.
pub const RTN_LOCAL: u32 = 2;

pub const NFTA_COUNTER_BYTES: u16 = 1;
pub const NFTA_COUNTER_PACKETS: u16 = 2;

pub const NFTA_GEN_ID: u16 = 1;

// ---- nft's userdata (libnftnl udata.h): type-length-value records ------------------------

/// `NFTNL_UDATA_RULE_COMMENT`, `NFTNL_UDATA_CHAIN_COMMENT`, `NFTNL_UDATA_TABLE_COMMENT`.
pub const NFTNL_UDATA_COMMENT: u8 = 0;
/// `NFTNL_UDATA_SET_KEYBYTEORDER`.
pub const NFTNL_UDATA_SET_KEYBYTEORDER: u8 = 0;
/// `NFTNL_UDATA_SET_DATABYTEORDER`.
pub const NFTNL_UDATA_SET_DATABYTEORDER: u8 = 1;
/// `NFTNL_UDATA_SET_COMMENT`.
pub const NFTNL_UDATA_SET_COMMENT: u8 = 7;

// ---- nft's data types (src/datatype.h), for a set's informational key and data types ----

pub const TYPE_VERDICT: u32 = 1;
pub const TYPE_INTEGER: u32 = 4;
pub const TYPE_IPADDR: u32 = 7;
pub const TYPE_IP6ADDR: u32 = 8;
pub const TYPE_INET_PROTOCOL: u32 = 12;
pub const TYPE_INET_SERVICE: u32 = 13;
/// Bits per type in a concatenation's type (`TYPE_BITS`).
pub const TYPE_BITS: u32 = 6;
