//! SPDK's io_device / io_channel: a shared device (`Arc<D>`, `Send + Sync`)
//! gets one `!Send` channel per core, created lazily on first use and cached.
//!
//! The per-core cache keeps only weak references: the channel lives as long
//! as someone on that core holds its `Rc` and is dropped, on its own core,
//! with the last one (the `Drop` of the channel type is the destroy
//! callback). The cache also keeps a `std::sync::Weak` of the device, which
//! pins the device's allocation, so its address (the cache key) cannot be
//! reused by another device while the entry exists.

use std::any::Any;
use std::collections::HashMap;
use std::rc::{self, Rc};
use std::sync::{self as ssync, Arc};

use crate::Reactor;

/// A shared device with per-core channels.
///
/// ```
/// use std::rc::Rc;
/// use std::cell::Cell;
/// use std::sync::Arc;
/// use pollux_reactor::{IoDevice, Reactor, TestCluster};
///
/// struct Counter;
/// struct CounterChannel { hits: Cell<u64> }
/// impl IoDevice for Counter {
///     type Channel = CounterChannel;
///     type Error = std::convert::Infallible;
///     fn create_channel(&self, _r: &Reactor) -> Result<CounterChannel, Self::Error> {
///         Ok(CounterChannel { hits: Cell::new(0) })
///     }
/// }
///
/// let cluster = TestCluster::new(1);
/// let dev = Arc::new(Counter);
/// cluster.on(0, |r| {
///     let a = r.channel(&dev).unwrap();
///     let b = r.channel(&dev).unwrap();
///     assert!(Rc::ptr_eq(&a, &b)); // cached on this core
/// });
/// ```
pub trait IoDevice: Send + Sync + 'static {
    /// The per-core state: usually holds `Rc`/`RefCell`, so it is `!Send`.
    type Channel: 'static;
    /// Why a channel could not be created.
    type Error;

    /// Creates this core's channel. Called on `r`'s core, at most once per
    /// core while a channel is alive. It may itself ask for other devices'
    /// channels (no borrow is held while it runs).
    ///
    /// # Errors
    ///
    /// Whatever the device reports; nothing is cached then.
    fn create_channel(&self, r: &Reactor) -> Result<Self::Channel, Self::Error>;
}

struct Entry {
    /// `std::sync::Weak<D>`: pins the device address.
    _device: Box<dyn Any>,
    channel: rc::Weak<dyn Any>,
}

/// One reactor's channel cache, keyed by device address.
#[derive(Default)]
pub(crate) struct ChannelCache {
    map: HashMap<usize, Entry>,
}

pub(crate) fn key_of<D: IoDevice>(dev: &Arc<D>) -> usize {
    Arc::as_ptr(dev) as *const () as usize
}

impl ChannelCache {
    /// The live channel of `dev` on this core.
    pub(crate) fn get<D: IoDevice>(&self, dev: &Arc<D>) -> Option<Rc<D::Channel>> {
        let e = self.map.get(&key_of(dev))?;
        e.channel.upgrade()?.downcast::<D::Channel>().ok()
    }

    /// Caches `ch` as `dev`'s channel; first drops entries whose channel
    /// is gone (control path).
    pub(crate) fn insert<D: IoDevice>(&mut self, dev: &Arc<D>, ch: &Rc<D::Channel>) {
        self.map.retain(|_, e| e.channel.strong_count() > 0);
        let any: Rc<dyn Any> = ch.clone();
        let weak_dev: ssync::Weak<D> = Arc::downgrade(dev);
        self.map.insert(
            key_of(dev),
            Entry {
                _device: Box::new(weak_dev),
                channel: Rc::downgrade(&any),
            },
        );
    }

    /// Live channels.
    pub(crate) fn live(&self) -> usize {
        self.map
            .values()
            .filter(|e| e.channel.strong_count() > 0)
            .count()
    }

    pub(crate) fn clear(&mut self) {
        self.map.clear();
    }
}
