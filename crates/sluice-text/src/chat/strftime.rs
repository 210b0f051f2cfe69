//! `strftime_now`'s formatting: C `strftime` over a UTC instant.

use std::fmt::Write as _;

/// C `strftime` over a UTC instant (seconds since the epoch), for the directives chat
/// templates use: `%a %A %b %B %h %d %e %j %m %y %Y %H %I %M %S %p %u %w %F %D %T %R %Z %z
/// %n %t %%`, and glibc's `%-d`-style flag that drops padding. Others are copied through.
pub(super) fn strftime(format: &str, unix: i64) -> String {
    const DAYS: [&str; 7] = [
        "Monday",
        "Tuesday",
        "Wednesday",
        "Thursday",
        "Friday",
        "Saturday",
        "Sunday",
    ];
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
    let days = unix.div_euclid(86_400);
    let secs = unix.rem_euclid(86_400);
    let (h, mi, s) = (secs / 3600, secs / 60 % 60, secs % 60);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy_mar = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy_mar + 2) / 153;
    let d = doy_mar - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    let leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    let cum = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
    let yday = cum[(m - 1) as usize] + d + i64::from(leap && m > 2);
    let wday = (days + 3).rem_euclid(7); // 0 = Monday
    let mut out = String::new();
    let mut it = format.chars().peekable();
    while let Some(c) = it.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let nopad = it.peek() == Some(&'-');
        if nopad {
            it.next();
        }
        let Some(dir) = it.next() else {
            out.push('%');
            break;
        };
        let num = |out: &mut String, v: i64, width: usize, pad: char| {
            if nopad {
                let _ = write!(out, "{v}");
            } else if pad == ' ' {
                let _ = write!(out, "{v:>width$}");
            } else {
                let _ = write!(out, "{v:0width$}");
            }
        };
        match dir {
            'a' => out.push_str(&DAYS[wday as usize][..3]),
            'A' => out.push_str(DAYS[wday as usize]),
            'b' | 'h' => out.push_str(&MONTHS[(m - 1) as usize][..3]),
            'B' => out.push_str(MONTHS[(m - 1) as usize]),
            'd' => num(&mut out, d, 2, '0'),
            'e' => num(&mut out, d, 2, ' '),
            'j' => num(&mut out, yday, 3, '0'),
            'm' => num(&mut out, m, 2, '0'),
            'y' => num(&mut out, y.rem_euclid(100), 2, '0'),
            'Y' => {
                let _ = write!(out, "{y}");
            }
            'H' => num(&mut out, h, 2, '0'),
            'I' => num(&mut out, (h + 11) % 12 + 1, 2, '0'),
            'M' => num(&mut out, mi, 2, '0'),
            'S' => num(&mut out, s, 2, '0'),
            'p' => out.push_str(if h < 12 { "AM" } else { "PM" }),
            'u' => num(&mut out, wday + 1, 1, '0'),
            'w' => num(&mut out, (wday + 1) % 7, 1, '0'),
            'F' => {
                let _ = write!(out, "{y}-{m:02}-{d:02}");
            }
            'D' => {
                let _ = write!(out, "{m:02}/{d:02}/{:02}", y.rem_euclid(100));
            }
            'T' => {
                let _ = write!(out, "{h:02}:{mi:02}:{s:02}");
            }
            'R' => {
                let _ = write!(out, "{h:02}:{mi:02}");
            }
            'Z' => out.push_str("UTC"),
            'z' => out.push_str("+0000"),
            'n' => out.push('\n'),
            't' => out.push('\t'),
            '%' => out.push('%'),
            other => {
                out.push('%');
                if nopad {
                    out.push('-');
                }
                out.push(other);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strftime_matches_python() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../testdata/tokenizers/strftime.json"
        );
        let cases: Vec<serde_json::Value> =
            serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        assert!(!cases.is_empty());
        for c in cases {
            let unix = c["unix"].as_i64().unwrap();
            let fmt = c["format"].as_str().unwrap();
            assert_eq!(
                strftime(fmt, unix),
                c["text"].as_str().unwrap(),
                "{fmt} at {unix}"
            );
        }
    }
}
