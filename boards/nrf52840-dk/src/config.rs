//! Build-time configuration: values from the build environment (`option_env!`), read in `const`
//! context, so a malformed value stops the build instead of a device in the field.

// Only ever evaluated at compile time (every caller is a `const`): an index out of range or an
// overflow here would be a build error, never a fault on the device.
#![allow(clippy::indexing_slicing, clippy::arithmetic_side_effects)]

use core::net::Ipv4Addr;

/// `value` if set at build time, else `default`.
pub const fn or(value: Option<&'static str>, default: &'static str) -> &'static str {
    match value {
        Some(v) => v,
        None => default,
    }
}

/// A dotted-quad IPv4 address: four decimal numbers 0..=255 with one to three digits each.
pub const fn ipv4(text: &str) -> Option<Ipv4Addr> {
    let bytes = text.as_bytes();
    let mut octets = [0u8; 4];
    let mut octet = 0usize;
    let mut value = 0u32;
    let mut digits = 0u32;
    let mut i = 0usize;
    while i < bytes.len() {
        let b = bytes[i];
        if b == b'.' {
            if digits == 0 || octet == 3 {
                return None;
            }
            octets[octet] = value as u8;
            octet += 1;
            value = 0;
            digits = 0;
        } else if b.is_ascii_digit() && digits < 3 {
            value = value * 10 + (b - b'0') as u32;
            digits += 1;
            if value > 255 {
                return None;
            }
        } else {
            return None;
        }
        i += 1;
    }
    if digits == 0 || octet != 3 {
        return None;
    }
    octets[3] = value as u8;
    Some(Ipv4Addr::new(octets[0], octets[1], octets[2], octets[3]))
}

/// A TCP port, 1..=65535, in decimal.
pub const fn port(text: &str) -> Option<u16> {
    let bytes = text.as_bytes();
    if bytes.is_empty() || bytes.len() > 5 {
        return None;
    }
    let mut value = 0u32;
    let mut i = 0usize;
    while i < bytes.len() {
        let b = bytes[i];
        if !b.is_ascii_digit() {
            return None;
        }
        value = value * 10 + (b - b'0') as u32;
        i += 1;
    }
    if value == 0 || value > 65535 { None } else { Some(value as u16) }
}

/// An absolute request path: starts with `/`, visible ASCII only (the uplink refuses anything
/// else as a request it cannot encode).
pub const fn path(text: &str) -> bool {
    let bytes = text.as_bytes();
    if bytes.is_empty() || bytes[0] != b'/' {
        return false;
    }
    let mut i = 0usize;
    while i < bytes.len() {
        if !bytes[i].is_ascii_graphic() {
            return false;
        }
        i += 1;
    }
    true
}

// The parsers are checked where they run, at compile time: a wrong one fails the build.
const fn same(a: Option<Ipv4Addr>, b: [u8; 4]) -> bool {
    match a {
        Some(a) => {
            let o = a.octets();
            o[0] == b[0] && o[1] == b[1] && o[2] == b[2] && o[3] == b[3]
        }
        None => false,
    }
}
const _: () = {
    assert!(same(ipv4("10.0.2.2"), [10, 0, 2, 2]));
    assert!(same(ipv4("255.255.255.255"), [255, 255, 255, 255]));
    assert!(same(ipv4("192.0.2.10"), [192, 0, 2, 10]));
    assert!(ipv4("").is_none());
    assert!(ipv4("1.2.3").is_none());
    assert!(ipv4("1.2.3.4.5").is_none());
    assert!(ipv4("1..3.4").is_none());
    assert!(ipv4("256.0.0.1").is_none());
    assert!(ipv4("1.2.3.4 ").is_none());
    assert!(ipv4("0001.2.3.4").is_none());
    assert!(ipv4("1.2.3.").is_none());
    assert!(matches!(port("8080"), Some(8080)));
    assert!(matches!(port("65535"), Some(65535)));
    assert!(port("0").is_none());
    assert!(port("65536").is_none());
    assert!(port("").is_none());
    assert!(port("80a").is_none());
    assert!(port("-1").is_none());
    assert!(path("/readings"));
    assert!(!path("readings"));
    assert!(!path("/a b"));
    assert!(!path(""));
};
