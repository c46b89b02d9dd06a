//! Small UTC date formatting without a date-time dependency: ISO 8601 timestamps for
//! `/v1/loads` and a subset of `strftime` for chat templates (`strftime_now`).

use std::time::{SystemTime, UNIX_EPOCH};

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const WEEKDAYS: [&str; 7] =
    ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"];

/// A UTC calendar date and time of day.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Civil {
    year: i64,
    month: u32,
    day: u32,
    hour: u64,
    minute: u64,
    second: u64,
    weekday: usize,
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
    Civil {
        year,
        month,
        day,
        hour: rem / 3600,
        minute: rem % 3600 / 60,
        second: rem % 60,
        // 1970-01-01 was a Thursday (index 3 from Monday).
        weekday: ((days + 3).rem_euclid(7)) as usize,
    }
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

/// Formats `unix_secs` (UTC) with `%Y %m %d %H %M %S %b %B %a %A %%`; other specifiers are
/// copied through unchanged.
pub(crate) fn strftime(unix_secs: u64, format: &str) -> String {
    let c = civil(unix_secs);
    let month = MONTHS[(c.month - 1) as usize];
    let weekday = WEEKDAYS[c.weekday];
    let mut out = String::with_capacity(format.len() + 16);
    let mut chars = format.chars();
    while let Some(ch) = chars.next() {
        if ch != '%' {
            out.push(ch);
            continue;
        }
        match chars.next() {
            Some('Y') => out.push_str(&c.year.to_string()),
            Some('m') => out.push_str(&format!("{:02}", c.month)),
            Some('d') => out.push_str(&format!("{:02}", c.day)),
            Some('H') => out.push_str(&format!("{:02}", c.hour)),
            Some('M') => out.push_str(&format!("{:02}", c.minute)),
            Some('S') => out.push_str(&format!("{:02}", c.second)),
            Some('b') => out.push_str(&month[..3]),
            Some('B') => out.push_str(month),
            Some('a') => out.push_str(&weekday[..3]),
            Some('A') => out.push_str(weekday),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn known_dates_format_like_python() {
        // 2024-07-26 00:00:00 UTC, a Friday (Llama 3's default template date).
        assert_eq!(strftime(1_721_952_000, "%d %b %Y"), "26 Jul 2024");
        assert_eq!(
            strftime(1_721_952_000, "%A %B %m/%d %H:%M:%S %%"),
            "Friday July 07/26 00:00:00 %"
        );
        // Leap day.
        assert_eq!(strftime(951_782_400, "%Y-%m-%d %a"), "2000-02-29 Tue");
        assert_eq!(strftime(0, "%Y-%m-%d %a"), "1970-01-01 Thu");
    }

    #[test]
    fn iso8601_has_micros_and_utc_offset() {
        let t = UNIX_EPOCH + Duration::from_micros(1_721_952_000_123_456);
        assert_eq!(iso8601(t), "2024-07-26T00:00:00.123456+00:00");
    }
}
