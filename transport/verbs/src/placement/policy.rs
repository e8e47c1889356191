//! [`PlacementPolicy`]: which poll group serves a new connection.

/// Where a target transport puts a new connection (queue pair). The poll
/// group whose listener received the connect request validates it either
/// way.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum PlacementPolicy {
    /// On the poll group with the fewest connections (placed and not yet
    /// destroyed, over all listeners), ties broken round robin. A request
    /// for another group is handed to that group's core by reactor message
    /// (a detached verbs connect request); that group creates the QP on
    /// its own CQ and SRQ, accepts, serves and destroys it.
    #[default]
    LeastConnections,
    /// Every connection stays on the poll group (core) that owns its
    /// listener (for debugging: one core sees a listener's whole traffic).
    ListenerCore,
}
