//! The one polling wait of the tests (ailb-core's, the emulator's and the e2e suite's).

use std::time::{Duration, Instant};

/// Polls `f` every 20 ms until it holds or `timeout` passes; returns whether it held. `f` is
/// asked once more at the deadline, so a condition that became true meanwhile is not missed.
pub fn wait_until(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if f() {
            return true;
        }
        let now = Instant::now();
        if now >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20).min(deadline - now));
    }
}
