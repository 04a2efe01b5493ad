//! Priority classes (docs/sessions-and-queues.md "Priority classes"): a request's class comes from `priorityHeader`;
//! when every endpoint is at `maxRequestCount` the lower classes are refused first (429 with
//! `Retry-After`), and the highest class may go `criticalHeadroom` above the cap. With priority
//! ceilings (ceiling.rs) a class above the caller's tenant's ceiling is clamped to it.

use super::ceiling::Ceilings;
use super::error::ConfigError;
use super::raw::RawLbConfig;
use super::read::Reader;

/// The classes when `priorityClasses` is absent, highest first.
pub const DEFAULT_CLASSES: [&str; 3] = ["critical", "standard", "sheddable"];
/// At most this many classes: the per-class counters are defined up front.
pub const MAX_CLASSES: usize = 8;

/// The route's priority settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Priority {
    /// Lower-case header name.
    pub header: String,
    /// Class names, highest first (lower-case).
    pub classes: Vec<String>,
    /// The rank given to a request without the header, or with a value naming no class.
    pub default_rank: usize,
    /// How far above `maxRequestCount` the highest class may load an endpoint.
    pub critical_headroom: u64,
    /// How far below `maxRequestCount` the lowest class is already refused.
    pub reserve: u64,
    /// The highest class each tenant may use (None: whatever the header names).
    pub ceilings: Option<Ceilings>,
}

/// A request's class: its rank (0 = highest), whether its value named no class, and the rank
/// its header asked for when that was above its tenant's ceiling (the rank is the ceiling).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Class {
    pub rank: usize,
    pub unknown: bool,
    pub clamped_from: Option<usize>,
}

impl Priority {
    pub(super) fn read(
        raw: &RawLbConfig,
        r: &mut Reader<'_>,
    ) -> Result<Option<Priority>, ConfigError> {
        let header = r.own("priorityHeader", &raw.priority_header)?;
        let classes = r.own("priorityClasses", &raw.priority_classes)?;
        let default = r.own("defaultPriorityClass", &raw.default_priority_class)?;
        let headroom = r.own("criticalHeadroom", &raw.critical_headroom)?;
        let reserve = r.own("priorityReserve", &raw.priority_reserve)?;
        let Some(header) = header else {
            for (key, set) in [
                ("priorityClasses", classes.is_some()),
                ("defaultPriorityClass", default.is_some()),
                ("criticalHeadroom", headroom.is_some()),
                ("priorityReserve", reserve.is_some()),
                // Typed and checked by ceiling.rs when priority classes are on.
                (
                    "priorityCeilings",
                    r.own("priorityCeilings", &raw.priority_ceilings)?.is_some(),
                ),
                (
                    "defaultPriorityCeiling",
                    r.own("defaultPriorityCeiling", &raw.default_priority_ceiling)?
                        .is_some(),
                ),
            ] {
                if set {
                    return Err(r.err(key, "needs `priorityHeader` (priority classes are off)"));
                }
            }
            return Ok(None);
        };
        // The header name itself is checked by the caller (common.rs, with the other headers).
        let classes: Vec<String> = match classes {
            None => DEFAULT_CLASSES.iter().map(|c| c.to_string()).collect(),
            Some(list) => list.iter().map(|c| c.trim().to_ascii_lowercase()).collect(),
        };
        if !(2..=MAX_CLASSES).contains(&classes.len()) {
            return Err(r.err(
                "priorityClasses",
                format!("needs 2 to {MAX_CLASSES} class names, highest first"),
            ));
        }
        for (n, c) in classes.iter().enumerate() {
            let valid = !c.is_empty()
                && c.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
                && c.parse::<u64>().is_err();
            if !valid {
                return Err(r.err(
                    &format!("priorityClasses[{n}]"),
                    "must be a non-numeric name of letters, digits, '-', '_' (integer header values are ranks)",
                ));
            }
            if classes[..n].contains(c) {
                return Err(r.err(&format!("priorityClasses[{n}]"), format!("`{c}` twice")));
            }
        }
        let default_rank = match default {
            Some(d) => {
                let d = d.trim().to_ascii_lowercase();
                match classes.iter().position(|c| *c == d) {
                    Some(rank) => rank,
                    None => {
                        return Err(r.err(
                            "defaultPriorityClass",
                            format!("`{d}` is not one of `priorityClasses`"),
                        ))
                    }
                }
            }
            None => classes
                .iter()
                .position(|c| c == "standard")
                .unwrap_or(classes.len() - 1),
        };
        let ceilings = Ceilings::read(raw, r, &classes, default_rank)?;
        Ok(Some(Priority {
            header: header.to_ascii_lowercase(),
            classes,
            default_rank,
            critical_headroom: headroom.unwrap_or(0),
            reserve: reserve.unwrap_or(0),
            ceilings,
        }))
    }

    /// The class of a request whose `priorityHeader` is `value`: a class name (any case) or
    /// its rank as an integer (0 = highest). A repeated header (values joined by `,`) gets the
    /// lowest class it names, so repeating the header never raises a request; a value naming
    /// no class (empty, unknown, out of range) gets the default class and `unknown`.
    pub fn class_of(&self, value: Option<&str>) -> Class {
        let Some(value) = value else {
            return Class {
                rank: self.default_rank,
                unknown: false,
                clamped_from: None,
            };
        };
        let mut lowest: Option<usize> = None;
        for part in value.split(',') {
            let part = part.trim();
            let rank = match part.parse::<usize>() {
                Ok(n) if n < self.classes.len() => Some(n),
                Ok(_) => None,
                Err(_) => self
                    .classes
                    .iter()
                    .position(|c| c.eq_ignore_ascii_case(part)),
            };
            match rank {
                Some(rank) => lowest = Some(lowest.map_or(rank, |l| l.max(rank))),
                None => {
                    return Class {
                        rank: self.default_rank,
                        unknown: true,
                        clamped_from: None,
                    }
                }
            }
        }
        Class {
            rank: lowest.unwrap_or(self.default_rank),
            unknown: lowest.is_none(),
            clamped_from: None,
        }
    }

    /// [`Priority::class_of`] held to the ceiling of the caller's tenant (its name as
    /// `Fairness::name_of` reads it; None: no tenant): never raised, lowered to the ceiling
    /// when above it. `clamped_from` says what a header asked for above the ceiling; a request
    /// without the header or naming no class gets its default class held to the ceiling
    /// silently (it claimed nothing).
    pub fn class_for(&self, value: Option<&str>, tenant: Option<&[u8]>) -> Class {
        let class = self.class_of(value);
        let Some(ceilings) = &self.ceilings else {
            return class;
        };
        let (ceiling, _) = ceilings.of(tenant);
        if class.rank >= ceiling {
            return class;
        }
        let asked = value.is_some() && !class.unknown;
        Class {
            rank: ceiling,
            unknown: class.unknown,
            clamped_from: asked.then_some(class.rank),
        }
    }

    /// The load cap a request of `rank` is refused at, from `maxRequestCount` = `cap` (> 0):
    /// the highest class `cap + criticalHeadroom`, the lowest `cap - priorityReserve` (at
    /// least 1), the classes between `cap`.
    pub fn cap_for(&self, rank: usize, cap: u64) -> u64 {
        if rank == 0 {
            cap.saturating_add(self.critical_headroom)
        } else if rank + 1 >= self.classes.len() {
            cap.saturating_sub(self.reserve).max(1)
        } else {
            cap
        }
    }

    pub fn is_lowest(&self, rank: usize) -> bool {
        rank + 1 >= self.classes.len()
    }

    /// Whether a request of `rank` may be shed for a predicted latency miss: only the lowest
    /// of two or more classes (critical requests never are; docs/latency-model.md §5).
    pub fn sheddable(&self, rank: usize) -> bool {
        self.classes.len() > 1 && self.is_lowest(rank)
    }
}
