//! [`Placer`]: the placement state of one target transport (its [`Seats`]
//! and the poll groups' [`Inbox`]es), and [`Placer::route`], which places
//! a validated connect request and hands it to another core if need be.

use std::marker::PhantomData;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use pollux_reactor::{CoreId, IoDevice, Reactor};

use super::{Handoff, Inbox, PlacementPolicy, Seats};
use crate::provider::{CmId, Provider};

/// Where [`Placer::route`] put a connect request.
pub enum Route<P: Provider, T> {
    /// Serve it on the calling group (its seat is taken there): accept or
    /// reject it, and [release](Seats::release) the seat if it is refused.
    Here(P::CmId, T),
    /// Handed to poll group `group` on `core` (seat taken there): that
    /// group's [`Inbox`] gets it, or it is rejected and its seat given back.
    Sent {
        /// The group's index.
        group: usize,
        /// Its core.
        core: CoreId,
    },
    /// No group can take it (none is open; or the id could not be detached
    /// and its home group takes nothing): reject it. No seat was taken.
    NoGroup(P::CmId, T),
}

impl<P: Provider, T> std::fmt::Debug for Route<P, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Route::Here(..) => f.write_str("Here"),
            Route::Sent { group, core } => f
                .debug_struct("Sent")
                .field("group", group)
                .field("core", core)
                .finish(),
            Route::NoGroup(..) => f.write_str("NoGroup"),
        }
    }
}

/// The connection placement of one target transport, generic over the
/// verbs provider and the context `T` a request carries to its group.
///
/// Shared (`Send + Sync`, in an `Arc`): it is also the io_device whose
/// per-core channel is that core's poll group's [`Inbox`]
/// ([`Placer::inbox`]). Poll group `index` on core `c`:
/// [`inbox`](Placer::inbox) and `seats().join(index, c)` at creation,
/// [`route`](Placer::route) for each validated request of its listeners,
/// [`Inbox::pop`] and [`PendingConn::attach`](crate::provider::PendingConn::attach)
/// for requests handed to it ([`refuse`](Placer::refuse) one that fails),
/// `seats().release(index)` when a connection is destroyed,
/// `seats().leave(index)` at shutdown.
pub struct Placer<P: Provider, T> {
    seats: Seats,
    refused: AtomicU64,
    /// Log prefix (the transport's name).
    label: &'static str,
    _p: PhantomData<fn() -> (P, T)>,
}

impl<P: Provider, T> std::fmt::Debug for Placer<P, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Placer")
            .field("label", &self.label)
            .field("seats", &self.seats)
            .field("refused", &self.refused.load(Ordering::Relaxed))
            .finish()
    }
}

impl<P: Provider, T: Send + 'static> IoDevice for Placer<P, T> {
    type Channel = Inbox<P, T>;
    type Error = std::convert::Infallible;

    fn create_channel(&self, _r: &Reactor) -> Result<Inbox<P, T>, Self::Error> {
        Ok(Inbox::new())
    }
}

impl<P: Provider, T: Send + 'static> Placer<P, T> {
    /// An empty table; `label` prefixes its log lines (e.g. `"iser"`).
    pub fn new(label: &'static str) -> Arc<Self> {
        Arc::new(Placer {
            seats: Seats::default(),
            refused: AtomicU64::new(0),
            label,
            _p: PhantomData,
        })
    }

    /// The poll groups and their connection counts.
    pub fn seats(&self) -> &Seats {
        &self.seats
    }

    /// This core's inbox (created on first use; keep it while the group
    /// takes requests: once the last handle is dropped, requests sent here
    /// are refused).
    pub fn inbox(self: &Arc<Self>, reactor: &Reactor) -> Rc<Inbox<P, T>> {
        reactor.channel(self).unwrap_or_else(|e| match e {})
    }

    /// A request placed on group `group` was refused before it became a
    /// connection (undeliverable, or its attach failed): its seat goes
    /// back and it counts in [`refused`](Self::refused). Dropping the
    /// request rejects it.
    pub fn refuse(&self, group: usize) {
        self.seats.release(group);
        self.refused.fetch_add(1, Ordering::Relaxed);
    }

    /// Requests placed and then refused ([`refuse`](Self::refuse)).
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// Place a validated connect request `id` that arrived at group `home`
    /// (on `from`'s core) by `policy`, with `context`:
    /// [`Route::Here`] when `home` serves it, [`Route::Sent`] when it was
    /// detached and sent to another group's core, [`Route::NoGroup`] when
    /// no group is open. An id that cannot be detached is served at home
    /// after all (its seat moves there), or [`Route::NoGroup`] if home
    /// takes nothing.
    pub fn route(
        self: &Arc<Self>,
        from: &Reactor,
        home: usize,
        policy: PlacementPolicy,
        id: P::CmId,
        context: T,
    ) -> Route<P, T> {
        let Some((group, core)) = self.seats.place(home, policy) else {
            return Route::NoGroup(id, context);
        };
        if group == home {
            return Route::Here(id, context);
        }
        match id.detach() {
            Ok(req) => {
                log::debug!(
                    "{}: connect request handed from core {} to core {core}",
                    self.label,
                    from.core()
                );
                self.hand_off(from, group, core, Handoff { req, context });
                Route::Sent { group, core }
            }
            Err(e) => {
                log::warn!(
                    "{}: {}; serving the connection on core {}",
                    self.label,
                    e.error,
                    from.core()
                );
                self.seats.release(group);
                match self.seats.place(home, PlacementPolicy::ListenerCore) {
                    Some(_) => Route::Here(e.id, context),
                    None => Route::NoGroup(e.id, context),
                }
            }
        }
    }

    /// Send `h`, placed on poll group `group` on `core` (its seat taken:
    /// [`Seats::place`]), to that core's [`Inbox`] (control path: boxes
    /// one message). [`route`](Self::route) does this; call it directly
    /// only when placing by hand. Undeliverable (the core stopped, no
    /// inbox there), the request is dropped (rejected) and
    /// [refused](Self::refuse).
    pub fn hand_off(
        self: &Arc<Self>,
        from: &Reactor,
        group: usize,
        core: CoreId,
        h: Handoff<P, T>,
    ) {
        let me = Arc::clone(self);
        let sent = from.send(core, move |r| match r.existing_channel(&me) {
            Some(inbox) => inbox.push(h),
            None => {
                log::warn!(
                    "{}: no poll group on core {} for a connect request; rejecting it",
                    me.label,
                    r.core()
                );
                me.refuse(group);
                drop(h);
            }
        });
        if let Err(e) = sent {
            log::warn!(
                "{}: cannot hand a connect request to core {core} ({e}); rejecting it",
                self.label
            );
            self.refuse(group);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cm::{CmEvent, ConnParam};
    use crate::conformance::{spin, Endpoint};
    use crate::conformance::{Fixture, SoftFixture};
    use crate::provider::{CmListener, Device, PendingConn};
    use crate::soft::Soft;
    use crate::types::QpCaps;
    use pollux_reactor::TestCluster;

    const FX: SoftFixture = SoftFixture::new("pollux-placer-test");

    /// A connect request received on a listener of the test thread.
    fn request(l: &<Soft as Provider>::CmListener) -> <Soft as Provider>::CmId {
        spin(|| l.get_request().expect("listener")).expect("connect request")
    }

    /// Groups 0 and 1 (on cores 0 and 1) joined, group 0 already serving
    /// one queue: the next request goes to group 1.
    fn group0_busy<T: Send + 'static>(placer: &Placer<Soft, T>) {
        placer.seats().join(0, 0);
        placer.seats().join(1, 1);
        assert!(placer
            .seats()
            .place(0, PlacementPolicy::ListenerCore)
            .is_some());
    }

    /// A listener, a peer connected to it with `data`, and the request.
    struct Incoming {
        addr: crate::CmAddr,
        l: <Soft as Provider>::CmListener,
        peer: Endpoint<SoftFixture>,
        peer_id: <Soft as Provider>::CmId,
        id: <Soft as Provider>::CmId,
    }

    fn incoming(data: &[u8]) -> Incoming {
        let dev = FX.open();
        let addr = FX.listen_addr();
        let l = dev.listen(&addr, 4).expect("listen");
        let peer = Endpoint::<SoftFixture>::new(&FX, QpCaps::default(), 4096, 16);
        let peer_id = peer
            .dev
            .connect(&addr, &peer.qp, &ConnParam::with_data(data))
            .expect("connect");
        let id = request(&l);
        Incoming {
            addr,
            l,
            peer,
            peer_id,
            id,
        }
    }

    #[test]
    fn a_request_travels_to_the_least_loaded_core_with_its_context() {
        let cl = TestCluster::new(2);
        let placer = Placer::<Soft, u16>::new("test");
        let inboxes: Vec<_> = (0..2u32).map(|c| cl.on(c, |r| placer.inbox(r))).collect();
        placer.seats().join(0, 0);
        placer.seats().join(1, 1);
        let dev = FX.open();
        let addr = FX.listen_addr();
        let l = dev.listen(&addr, 4).expect("listen");
        let peers: Vec<_> = (0..2)
            .map(|_| Endpoint::<SoftFixture>::new(&FX, QpCaps::default(), 4096, 16))
            .collect();

        // The first stays home (both empty, the turn starts at group 0).
        let _a = peers[0]
            .dev
            .connect(&addr, &peers[0].qp, &ConnParam::with_data(b"a"))
            .expect("connect");
        let id = request(&l);
        let r0 = cl.reactor(0);
        let here = placer.route(&r0, 0, PlacementPolicy::LeastConnections, id, 7);
        assert!(matches!(here, Route::Here(_, 7)), "{here:?}");

        // The second goes to core 1 and waits in its inbox, not core 0's.
        let _b = peers[1]
            .dev
            .connect(&addr, &peers[1].qp, &ConnParam::with_data(b"b"))
            .expect("connect");
        let id = request(&l);
        let sent = placer.route(&r0, 0, PlacementPolicy::LeastConnections, id, 9);
        assert!(
            matches!(sent, Route::Sent { group: 1, core: 1 }),
            "{sent:?}"
        );
        assert!(cl.poll_until_idle().is_ok());
        assert!(inboxes[0].is_empty());
        assert_eq!(inboxes[1].len(), 1);
        let h = inboxes[1].pop().expect("handed over");
        assert_eq!(h.context, 9);
        assert!(h.req.request().private_data.as_bytes().starts_with(b"b"));
        assert_eq!(placer.seats().loads(), [1, 1]);
        assert_eq!(placer.refused(), 0);
        drop(l);
    }

    #[test]
    fn an_undeliverable_request_is_rejected_and_its_seat_given_back() {
        let cl = TestCluster::new(2);
        let placer = Placer::<Soft, ()>::new("test");
        let _home = cl.on(0, |r| placer.inbox(r));
        // Group 1 joined but holds no inbox (it is gone): a request placed
        // there cannot be delivered.
        group0_busy(&placer);
        let Incoming {
            addr,
            l,
            peer,
            peer_id: ida,
            id,
        } = incoming(b"x");
        let r0 = cl.reactor(0);
        let sent = placer.route(&r0, 0, PlacementPolicy::LeastConnections, id, ());
        assert!(matches!(sent, Route::Sent { group: 1, .. }), "{sent:?}");
        assert_eq!(placer.seats().loads(), [1, 1]);
        assert!(cl.poll_until_idle().is_ok());
        assert_eq!(placer.refused(), 1);
        assert_eq!(placer.seats().loads(), [1, 0]);
        let ev = spin(|| ida.get_event().expect("event")).expect("an answer");
        assert!(matches!(ev, CmEvent::Rejected { .. }), "{ev:?}");

        // No group open at all: the caller keeps the request.
        placer.seats().leave(0);
        placer.seats().leave(1);
        let _b = peer
            .dev
            .connect(&addr, &peer.qp, &ConnParam::with_data(b"y"));
        let id = request(&l);
        let none = placer.route(&r0, 0, PlacementPolicy::LeastConnections, id, ());
        assert!(matches!(none, Route::NoGroup(..)), "{none:?}");
        drop(l);
    }

    #[test]
    fn attach_on_the_destination_gives_a_usable_id() {
        let cl = TestCluster::new(2);
        let placer = Placer::<Soft, &'static str>::new("test");
        let inbox = cl.on(1, |r| placer.inbox(r));
        let _home = cl.on(0, |r| placer.inbox(r));
        group0_busy(&placer);
        // The peer stays connected until the end.
        let Incoming {
            l,
            id,
            peer: _peer,
            peer_id: _a,
            ..
        } = incoming(b"z");
        let r0 = cl.reactor(0);
        let sent = placer.route(&r0, 0, PlacementPolicy::LeastConnections, id, "ctx");
        assert!(matches!(sent, Route::Sent { group: 1, .. }), "{sent:?}");
        assert!(cl.poll_until_idle().is_ok());
        let h = inbox.pop().expect("delivered");
        let other = FX.open();
        let id = h
            .req
            .attach(&other)
            .expect("attach on the destination's device");
        assert!(id
            .request()
            .is_some_and(|r| r.private_data.as_bytes().starts_with(b"z")));
        assert_eq!(h.context, "ctx");
        drop(l);
    }
}
