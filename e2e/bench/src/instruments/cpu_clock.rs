//! The calling thread's CPU time, for the VM-time figures' CPU twin (`gateway.vm_call_cpu_ns`,
//! `AILB_VM_CPU_TIME`).
//!
//! `gateway.vm_call_ns` is wall time: a worker preempted inside a VM call (four workers, the
//! fake pods and the load generator share this machine's two cores) counts the other
//! threads' time as the plugin's. The thread's CPU clock counts only time this thread ran.
//! It costs a system call per read (it is not in the vDSO), so it is off unless asked for,
//! and the wall figures keep their cost.

/// This thread's CPU time in ns (`CLOCK_THREAD_CPUTIME_ID`); None should the clock fail, so
/// a failed read is never taken for a time of 0 (which would count the thread's whole life).
pub fn thread_ns() -> Option<u64> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the duration of the call.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return None;
    }
    Some(
        (ts.tv_sec as u64)
            .saturating_mul(1_000_000_000)
            .saturating_add(ts.tv_nsec as u64),
    )
}

/// The thread's CPU time spent in `f`, beside its result; None when the clock failed.
pub fn timed<R>(f: impl FnOnce() -> R) -> (R, Option<u64>) {
    let at = thread_ns();
    let r = f();
    let spent = at.zip(thread_ns()).map(|(at, now)| now.saturating_sub(at));
    (r, spent)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    #[test]
    fn the_clock_counts_this_threads_work_and_not_its_sleep() {
        let ((), slept) = timed(|| std::thread::sleep(Duration::from_millis(50)));
        let slept = slept.expect("the clock answered");
        assert!(slept < 20_000_000, "50 ms asleep counted {slept} ns");
        let wall = Instant::now();
        let ((), busy) = timed(|| {
            let mut x = 1u64;
            while wall.elapsed() < Duration::from_millis(30) {
                x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
            }
        });
        let busy = busy.expect("the clock answered");
        assert!(
            busy >= 1_000_000,
            "30 ms of spinning counted only {busy} ns"
        );
        assert!(busy <= wall.elapsed().as_nanos() as u64 + 1_000_000);
    }
}
