//! The VM's randomness: tie-break seeds and request ids, from one SplitMix64 stream seeded with
//! the host's entropy at configure (docs/architecture.md "Crates").

use crate::hash::SplitMix64;

pub struct VmRng {
    stream: SplitMix64,
    /// High bits of the seed: makes request ids unique across VMs and gateways.
    nonce: u64,
    next_id: u64,
}

impl VmRng {
    pub fn new(seed: u64) -> VmRng {
        VmRng {
            stream: SplitMix64(seed | 1),
            nonce: seed >> 32,
            next_id: 0,
        }
    }

    pub fn next_u64(&mut self) -> u64 {
        self.stream.next_u64()
    }

    /// A request id unique in this VM's lifetime, and across VMs with high probability.
    pub fn request_id(&mut self) -> String {
        self.next_id += 1;
        format!("{:08x}{:x}", self.nonce, self.next_id)
    }
}
