//! The embedding example (`examples/appliance.rs`) runs and does what it says:
//! its own backend's data is read on both cores, the malloc round trip
//! matches, and its own poller ran.

#[path = "../../examples/appliance.rs"]
mod appliance;

#[test]
fn appliance_runs_its_own_bdev_and_pollers_on_two_cores() {
    let reports = appliance::run().expect("appliance run");
    assert_eq!(reports.len(), 2);
    for (i, r) in reports.iter().enumerate() {
        assert_eq!(r.core, i as u32);
        assert!(r.rom_ok, "core {i}: ROM data wrong");
        assert!(r.malloc_ok, "core {i}: malloc round trip wrong");
        assert!(r.poller_runs > 0, "core {i}: own poller never ran");
    }
}
