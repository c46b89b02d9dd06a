//! Small UTC date formatting without a date-time dependency: ISO 8601 timestamps for
//! `/v1/loads`.

use std::time::{SystemTime, UNIX_EPOCH};

/// A UTC calendar date and time of day.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Civil {
    year: i64,
    month: u32,
    day: u32,
    hour: u64,
    minute: u64,
    second: u64,
}

/// Howard Hinnant's days-to-civil algorithm.
fn civil(unix_secs: u64) -> Civil {
    let days = (unix_secs / 86_400) as i64;
    let rem = unix_secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    Civil { year, month, day, hour: rem / 3600, minute: rem % 3600 / 60, second: rem % 60 }
}

/// `YYYY-MM-DDTHH:MM:SS.ffffff+00:00`, the shape SGLang prints.
pub(crate) fn iso8601(time: SystemTime) -> String {
    let since = time.duration_since(UNIX_EPOCH).unwrap_or_default();
    let c = civil(since.as_secs());
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:06}+00:00",
        c.year,
        c.month,
        c.day,
        c.hour,
        c.minute,
        c.second,
        since.subsec_micros()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn iso8601_has_micros_and_utc_offset() {
        let t = UNIX_EPOCH + Duration::from_micros(1_721_952_000_123_456);
        assert_eq!(iso8601(t), "2024-07-26T00:00:00.123456+00:00");
    }
}
