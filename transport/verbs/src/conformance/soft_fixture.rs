//! [`SoftFixture`]: the software provider as a [`Fixture`], for the
//! conformance suite, the fault tests, benches and examples that run two
//! endpoints in one process.

use std::sync::atomic::{AtomicU32, Ordering};

use super::Fixture;
use crate::provider::Provider;
use crate::soft::{Soft, SoftDevice, SOFT_DEVICE_NAME};
use crate::CmAddr;

/// The soft provider's device, and abstract listen addresses
/// `@PREFIX-PID-N` that no other process or earlier call uses.
#[derive(Debug, Clone, Copy)]
pub struct SoftFixture {
    prefix: &'static str,
}

impl SoftFixture {
    /// A fixture whose listen addresses start with `@prefix`.
    pub const fn new(prefix: &'static str) -> Self {
        SoftFixture { prefix }
    }
}

impl Fixture for SoftFixture {
    type P = Soft;
    fn open(&self) -> SoftDevice {
        Soft::open_device(SOFT_DEVICE_NAME).expect("the soft device always opens")
    }
    fn listen_addr(&self) -> CmAddr {
        static N: AtomicU32 = AtomicU32::new(0);
        CmAddr::new(format!(
            "@{}-{}-{}",
            self.prefix,
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ))
    }
}
