//! `strftime` for `strftime_now` without a date-time dependency: UTC, the C locale, the
//! specifiers chat templates use.

use std::fmt::Write;

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
struct Civil {
    year: i64,
    month: u32,
    day: u32,
    day_of_year: u32,
    hour: u32,
    minute: u32,
    second: u32,
    /// 0 = Monday.
    weekday: usize,
}

fn is_leap(year: i64) -> bool {
    (year % 4 == 0 && year % 100 != 0) || year % 400 == 0
}

/// Howard Hinnant's days-to-civil algorithm.
fn civil(unix_secs: i64) -> Civil {
    let days = unix_secs.div_euclid(86_400);
    let rem = unix_secs.rem_euclid(86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    const CUMULATIVE: [u32; 12] = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
    let day_of_year =
        CUMULATIVE[(month - 1) as usize] + day + u32::from(month > 2 && is_leap(year));
    Civil {
        year,
        month,
        day,
        day_of_year,
        hour: (rem / 3600) as u32,
        minute: (rem % 3600 / 60) as u32,
        second: (rem % 60) as u32,
        // 1970-01-01 was a Thursday (3 days after a Monday).
        weekday: (days + 3).rem_euclid(7) as usize,
    }
}

/// Formats `unix_secs` (UTC) like Python's `datetime.strftime` in the C locale, for
/// `%a %A %b %h %B %d %e %H %I %j %m %M %p %S %y %Y %F %T %D %%` and glibc's `%-d`-style
/// unpadded numbers; other specifiers are copied through unchanged.
pub fn strftime(unix_secs: i64, format: &str) -> String {
    let c = civil(unix_secs);
    let month = MONTHS[(c.month - 1) as usize];
    let weekday = WEEKDAYS[c.weekday];
    let hour12 = match c.hour % 12 {
        0 => 12,
        h => h,
    };
    let mut out = String::with_capacity(format.len() + 16);
    let mut chars = format.chars().peekable();
    while let Some(ch) = chars.next() {
        if ch != '%' {
            out.push(ch);
            continue;
        }
        let unpadded = chars.next_if_eq(&'-').is_some();
        let number = |out: &mut String, value: u32, width: usize| {
            let _ = if unpadded { write!(out, "{value}") } else { write!(out, "{value:0width$}") };
        };
        match chars.next() {
            Some('Y') => {
                let _ = write!(out, "{}", c.year);
            }
            Some('y') => number(&mut out, c.year.rem_euclid(100) as u32, 2),
            Some('m') => number(&mut out, c.month, 2),
            Some('d') => number(&mut out, c.day, 2),
            Some('e') => {
                let _ = write!(out, "{:>2}", c.day);
            }
            Some('j') => number(&mut out, c.day_of_year, 3),
            Some('H') => number(&mut out, c.hour, 2),
            Some('I') => number(&mut out, hour12, 2),
            Some('M') => number(&mut out, c.minute, 2),
            Some('S') => number(&mut out, c.second, 2),
            Some('p') => out.push_str(if c.hour < 12 { "AM" } else { "PM" }),
            Some('b' | 'h') => out.push_str(&month[..3]),
            Some('B') => out.push_str(month),
            Some('a') => out.push_str(&weekday[..3]),
            Some('A') => out.push_str(weekday),
            Some('F') => {
                let _ = write!(out, "{}-{:02}-{:02}", c.year, c.month, c.day);
            }
            Some('T') => {
                let _ = write!(out, "{:02}:{:02}:{:02}", c.hour, c.minute, c.second);
            }
            Some('D') => {
                let _ = write!(out, "{:02}/{:02}/{:02}", c.month, c.day, c.year.rem_euclid(100));
            }
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                if unpadded {
                    out.push('-');
                }
                out.push(other);
            }
            None => {
                out.push('%');
                if unpadded {
                    out.push('-');
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::strftime;

    #[test]
    fn known_dates_format_like_python() {
        // 2024-07-26 00:00:00 UTC, a Friday (Llama 3's default template date).
        assert_eq!(strftime(1_721_952_000, "%d %b %Y"), "26 Jul 2024");
        assert_eq!(
            strftime(1_721_952_000, "%A %B %m/%d %H:%M:%S %%"),
            "Friday July 07/26 00:00:00 %"
        );
        // 2024-02-29 13:05:09 UTC, a leap day.
        assert_eq!(strftime(1_709_211_909, "%d %b %Y %H:%M:%S"), "29 Feb 2024 13:05:09");
        assert_eq!(strftime(1_709_211_909, "%I%p %j %-d/%-m/%y %e %a"), "01PM 060 29/2/24 29 Thu");
        assert_eq!(strftime(951_782_400, "%F %a %T %D"), "2000-02-29 Tue 00:00:00 02/29/00");
        assert_eq!(strftime(0, "%Y-%m-%d %a %B %e %j"), "1970-01-01 Thu January  1 001");
        assert_eq!(strftime(0, "%Q %-Q 100%"), "%Q %-Q 100%");
    }
}
