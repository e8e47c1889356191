//! Set/Get Features fields and asynchronous event completions.

use super::cmd::{AdminOpcode, NvmeCmd};

/// Feature identifiers.
pub mod fid {
    /// Arbitration.
    pub const ARBITRATION: u8 = 0x01;
    /// Power Management.
    pub const POWER_MANAGEMENT: u8 = 0x02;
    /// Temperature Threshold.
    pub const TEMPERATURE_THRESHOLD: u8 = 0x04;
    /// Volatile Write Cache.
    pub const VOLATILE_WRITE_CACHE: u8 = 0x06;
    /// Number of Queues.
    pub const NUMBER_OF_QUEUES: u8 = 0x07;
    /// Asynchronous Event Configuration.
    pub const ASYNC_EVENT_CONFIG: u8 = 0x0B;
    /// Keep Alive Timer.
    pub const KEEP_ALIVE_TIMER: u8 = 0x0F;
    /// Host Identifier.
    pub const HOST_IDENTIFIER: u8 = 0x81;
}

/// Set/Get Features fields (CDW10 FID/SEL/SV, CDW11 value).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FeatureCmd {
    /// Feature id (CDW10 bits 0-7).
    pub fid: u8,
    /// Get: select (CDW10 bits 8-10).
    pub sel: u8,
    /// Set: save (CDW10 bit 31).
    pub save: bool,
    /// CDW11: the value (Set) or a parameter (Get).
    pub cdw11: u32,
}

impl FeatureCmd {
    /// The fields of `cmd`.
    pub fn from_cmd(cmd: &NvmeCmd) -> Self {
        FeatureCmd {
            fid: cmd.cdw10 as u8,
            sel: ((cmd.cdw10 >> 8) & 7) as u8,
            save: cmd.cdw10 >> 31 != 0,
            cdw11: cmd.cdw11,
        }
    }

    /// A Set Features SQE.
    pub fn set(fid: u8, value: u32, cid: u16) -> NvmeCmd {
        let mut c = NvmeCmd::new(AdminOpcode::SetFeatures.code(), cid);
        c.cdw10 = u32::from(fid);
        c.cdw11 = value;
        c
    }

    /// A Get Features SQE (current value).
    pub fn get(fid: u8, cid: u16) -> NvmeCmd {
        let mut c = NvmeCmd::new(AdminOpcode::GetFeatures.code(), cid);
        c.cdw10 = u32::from(fid);
        c
    }
}

/// Number of Queues: `(NSQR, NCQR)` requested, 1-based, from CDW11
/// (0-based halves). `None` when either half is 0xFFFF (invalid).
pub fn parse_num_queues(cdw11: u32) -> Option<(u32, u32)> {
    let nsq = cdw11 & 0xFFFF;
    let ncq = cdw11 >> 16;
    if nsq == 0xFFFF || ncq == 0xFFFF {
        return None;
    }
    Some((nsq + 1, ncq + 1))
}

/// Number of Queues value (CDW11 of Set, DW0 of the completion) for `nsq`
/// submission and `ncq` completion queues (1-based counts, ≥ 1).
pub fn num_queues_value(nsq: u32, ncq: u32) -> u32 {
    (nsq.saturating_sub(1) & 0xFFFF) | ((ncq.saturating_sub(1) & 0xFFFF) << 16)
}

/// Asynchronous Event Configuration / OAES bit: namespace attribute notices.
pub const AEN_NS_ATTR: u32 = 1 << 8;
/// AEC / OAES bit: firmware activation notices.
pub const AEN_FW_ACTIVATION: u32 = 1 << 9;
/// AEC / OAES bit: ANA change notices.
pub const AEN_ANA_CHANGE: u32 = 1 << 11;
/// AEC / OAES bit: discovery log page change notices.
pub const AEN_DISCOVERY_CHANGE: u32 = 1 << 31;

/// Asynchronous event type (completion DW0 bits 0-2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum AsyncEventType {
    /// Error status.
    Error = 0,
    /// SMART / health status.
    Smart = 1,
    /// Notice.
    Notice = 2,
    /// I/O command set specific.
    IoCommandSet = 6,
    /// Vendor specific.
    Vendor = 7,
}

/// Notice info: namespace attribute changed.
pub const AEN_INFO_NS_ATTR_CHANGED: u8 = 0x00;
/// Notice info: discovery log page changed.
pub const AEN_INFO_DISCOVERY_CHANGED: u8 = 0xF0;

/// An asynchronous event, as an AER completion reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AsyncEvent {
    /// Event type (3 bits).
    pub event_type: u8,
    /// Event information.
    pub info: u8,
    /// The log page to read (clears the event).
    pub log_page: u8,
}

impl AsyncEvent {
    /// The namespace attribute changed notice (read log 0x04).
    pub const NS_CHANGED: AsyncEvent = AsyncEvent {
        event_type: AsyncEventType::Notice as u8,
        info: AEN_INFO_NS_ATTR_CHANGED,
        log_page: 0x04,
    };
    /// The discovery log changed notice (read log 0x70).
    pub const DISCOVERY_CHANGED: AsyncEvent = AsyncEvent {
        event_type: AsyncEventType::Notice as u8,
        info: AEN_INFO_DISCOVERY_CHANGED,
        log_page: 0x70,
    };

    /// Completion DW0.
    pub fn to_dw0(&self) -> u32 {
        u32::from(self.event_type & 7)
            | (u32::from(self.info) << 8)
            | (u32::from(self.log_page) << 16)
    }

    /// Decode a completion DW0.
    pub fn from_dw0(dw0: u32) -> Self {
        AsyncEvent {
            event_type: (dw0 & 7) as u8,
            info: (dw0 >> 8) as u8,
            log_page: (dw0 >> 16) as u8,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn number_of_queues() {
        assert_eq!(parse_num_queues(0x0003_0007), Some((8, 4)));
        assert_eq!(parse_num_queues(0xFFFF_0000), None);
        assert_eq!(num_queues_value(128, 128), 0x007F_007F);
        let c = FeatureCmd::set(fid::NUMBER_OF_QUEUES, 0x0001_0001, 2);
        let f = FeatureCmd::from_cmd(&c);
        assert_eq!(f.fid, 7);
        assert_eq!(f.cdw11, 0x0001_0001);
    }

    #[test]
    fn aen_dw0() {
        assert_eq!(AsyncEvent::NS_CHANGED.to_dw0(), 0x0004_0002);
        assert_eq!(AsyncEvent::DISCOVERY_CHANGED.to_dw0(), 0x0070_F002);
        assert_eq!(AsyncEvent::from_dw0(0x0004_0002), AsyncEvent::NS_CHANGED);
    }
}
