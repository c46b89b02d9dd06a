//! Storage tiers a block can live on, ordered from fastest to slowest.

use std::fmt;

/// The storage tier of a block, as engines name it in the `medium` field.
///
/// Ordered fastest first, so `min` of two tiers is the better one. A missing `medium` means
/// [`Medium::Gpu`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum Medium {
    /// Device memory (`GPU`): reusable with no transfer.
    Gpu = 0,
    /// Page-locked host memory (`CPU_PINNED`).
    CpuPinned = 1,
    /// Host memory (`CPU`).
    Cpu = 2,
    /// Local disk (`DISK`).
    Disk = 3,
    /// A storage service (`STORAGE`).
    Storage = 4,
    /// Anything outside the engine (`EXTERNAL`).
    External = 5,
}

impl Medium {
    /// Every tier, fastest first.
    pub const ALL: [Medium; 6] = [
        Medium::Gpu,
        Medium::CpuPinned,
        Medium::Cpu,
        Medium::Disk,
        Medium::Storage,
        Medium::External,
    ];

    /// Parses the wire spelling (`GPU`, `CPU`, `CPU_PINNED`, `DISK`, `STORAGE`, `EXTERNAL`),
    /// ignoring ASCII case.
    pub fn parse(name: &str) -> Option<Medium> {
        Medium::ALL.into_iter().find(|m| m.as_str().eq_ignore_ascii_case(name))
    }

    /// The wire spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Medium::Gpu => "GPU",
            Medium::CpuPinned => "CPU_PINNED",
            Medium::Cpu => "CPU",
            Medium::Disk => "DISK",
            Medium::Storage => "STORAGE",
            Medium::External => "EXTERNAL",
        }
    }

    /// This tier as a one-bit set.
    pub(crate) fn bit(self) -> u8 {
        1 << (self as u8)
    }
}

impl fmt::Display for Medium {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_wire_name_and_orders_fastest_first() {
        for medium in Medium::ALL {
            assert_eq!(Medium::parse(medium.as_str()), Some(medium));
        }
        assert_eq!(Medium::parse("cpu_pinned"), Some(Medium::CpuPinned));
        assert_eq!(Medium::parse("TAPE"), None);
        assert!(Medium::Gpu < Medium::Cpu && Medium::Cpu < Medium::External);
        assert_eq!(Medium::Cpu.bit(), 0b100);
    }
}
