//! The shared bdev object and its open descriptors.
//!
//! A [`Bdev`] wraps one backend and is shared (`Arc`) by every core. Opening
//! it gives a [`BdevDesc`] (`Send`: it may travel to the cores that use it);
//! a descriptor gives each reactor its [`IoChannel`]. Opening, closing and
//! channel creation are control path: they may lock and allocate.

use std::sync::Arc;

use pollux_reactor::sync::{Mutex, MutexGuard};

use pollux_reactor::{IoDevice, Reactor};

use crate::backend::BdevBackend;
use crate::channel::{ChannelCore, IoChannel};
use crate::info::BdevInfo;
use crate::io::{BdevError, IoType};

#[derive(Default)]
struct OpenState {
    opens: usize,
    removed: bool,
}

/// A block device: one backend, shared by all cores.
pub struct Bdev {
    backend: Arc<dyn BdevBackend>,
    /// Bit `i` set: `IoType::ALL[i]` is supported (asked once, at creation).
    supported: u8,
    state: Mutex<OpenState>,
}

impl std::fmt::Debug for Bdev {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bdev").field("info", self.info()).finish()
    }
}

pub(crate) fn type_bit(t: IoType) -> u8 {
    1 << (t as u8)
}

impl Bdev {
    /// A bdev over `backend`, not registered anywhere (see
    /// [`BdevRegistry::register`](crate::BdevRegistry::register)).
    pub fn new(backend: Arc<dyn BdevBackend>) -> Arc<Bdev> {
        let supported = IoType::ALL
            .iter()
            .filter(|t| backend.supports(**t))
            .fold(0u8, |m, t| m | type_bit(*t));
        Arc::new(Bdev {
            backend,
            supported,
            state: Mutex::new(OpenState::default()),
        })
    }

    /// Name, geometry and metadata layout.
    pub fn info(&self) -> &BdevInfo {
        self.backend.info()
    }

    /// The bdev's name.
    pub fn name(&self) -> &str {
        self.backend.info().name()
    }

    /// Whether the backend handles `io_type`.
    pub fn supports(&self, io_type: IoType) -> bool {
        self.supported & type_bit(io_type) != 0
    }

    pub(crate) fn supported_mask(&self) -> u8 {
        self.supported
    }

    /// The backend.
    pub fn backend(&self) -> &Arc<dyn BdevBackend> {
        &self.backend
    }

    fn lock(&self) -> MutexGuard<'_, OpenState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Open a descriptor; `writable` allows write, write zeroes and unmap.
    /// Control path (takes a lock).
    ///
    /// # Errors
    ///
    /// [`BdevError::NotFound`] when the bdev was destroyed.
    pub fn open(self: &Arc<Self>, writable: bool) -> Result<BdevDesc, BdevError> {
        let mut st = self.lock();
        if st.removed {
            return Err(BdevError::NotFound(self.name().to_owned()));
        }
        st.opens += 1;
        Ok(BdevDesc {
            bdev: Arc::clone(self),
            writable,
        })
    }

    /// Open descriptors.
    pub fn open_count(&self) -> usize {
        self.lock().opens
    }

    /// Refuse further opens; fails while descriptors are open.
    pub(crate) fn mark_removed(&self) -> Result<(), BdevError> {
        let mut st = self.lock();
        if st.opens > 0 {
            return Err(BdevError::InUse {
                name: self.name().to_owned(),
                opens: st.opens,
            });
        }
        st.removed = true;
        Ok(())
    }
}

/// The per-core channel of a bdev is the reactor's io_device channel: one per
/// core, shared by every descriptor of the bdev on that core.
impl IoDevice for Bdev {
    type Channel = ChannelCore;
    type Error = BdevError;

    fn create_channel(&self, r: &Reactor) -> Result<ChannelCore, BdevError> {
        ChannelCore::new(self, r)
    }
}

/// An open bdev. `Send`: open on the control thread, hand it to the cores.
/// Closed on drop.
#[derive(Debug)]
pub struct BdevDesc {
    bdev: Arc<Bdev>,
    writable: bool,
}

impl BdevDesc {
    /// The bdev.
    pub fn bdev(&self) -> &Arc<Bdev> {
        &self.bdev
    }

    /// Whether write-type I/O is allowed through this descriptor.
    pub fn is_writable(&self) -> bool {
        self.writable
    }

    /// The bdev's I/O channel on `reactor`'s core (created on first use,
    /// shared by the core's descriptors, dropped with its last handle).
    /// Control path: call it once per submitter and keep the handle.
    ///
    /// # Errors
    ///
    /// Whatever the backend reports when it sets up its per-core state.
    pub fn channel(&self, reactor: &Reactor) -> Result<IoChannel, BdevError> {
        let core = reactor.channel(&self.bdev)?;
        Ok(IoChannel::new(core, self.writable))
    }

    /// The channel of the reactor running on this thread.
    ///
    /// # Errors
    ///
    /// [`BdevError::NoReactor`] off a reactor thread, or as [`BdevDesc::channel`].
    pub fn current_channel(&self) -> Result<IoChannel, BdevError> {
        let r = Reactor::current().ok_or(BdevError::NoReactor)?;
        self.channel(&r)
    }
}

impl Drop for BdevDesc {
    fn drop(&mut self) {
        let mut st = self.bdev.lock();
        st.opens = st.opens.saturating_sub(1);
    }
}
