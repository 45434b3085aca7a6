//! One macro for the enums whose variants have names on a wire or in configuration: it writes
//! the enum, its `ALL`, `name` and `from_name`, and its serde names, from one list, so the
//! three cannot drift apart.

/// Declares a field-less enum from `Variant => "name"` pairs (a discriminant may follow the
/// variant), with the derives every public type has, serde names equal to the names, and
///
/// - `ALL`: every variant, in declaration order;
/// - `name`: the variant's name, as configuration, `wary plan` and the ledgers spell it;
/// - `from_name`: the variant of a name, `None` for any other string.
macro_rules! named_enum {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident {
            $(
                $(#[$vmeta:meta])*
                $variant:ident $(= $disc:literal)? => $text:literal
            ),+ $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[cfg_attr(feature = "defmt", derive(defmt::Format))]
        #[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
        $vis enum $name {
            $(
                $(#[$vmeta])*
                #[cfg_attr(feature = "serde", serde(rename = $text))]
                $variant $(= $disc)?,
            )+
        }

        impl $name {
            /// Every variant, in a fixed order.
            pub const ALL: [$name; [$($text),+].len()] = [$($name::$variant),+];

            /// The name configuration, `wary plan` and the ledgers use (also the serde name).
            pub const fn name(&self) -> &'static str {
                match self {
                    $($name::$variant => $text,)+
                }
            }

            #[doc = concat!("Parses [`", stringify!($name), "::name`] back.")]
            pub fn from_name(name: &str) -> Option<Self> {
                match name {
                    $($text => Some($name::$variant),)+
                    _ => None,
                }
            }
        }
    };
}

pub(crate) use named_enum;

#[cfg(test)]
mod tests {
    use crate::{Class, Jitter, Preset, RetryAfterMode, Rule, Transport, retry_after::Ambiguous};

    /// Every name reads back as its variant, names are distinct, an unknown name is `None`,
    /// and (with serde) the serde name is the name.
    fn check<T: Copy + PartialEq + core::fmt::Debug>(
        all: &[T],
        name: fn(&T) -> &'static str,
        from: fn(&str) -> Option<T>,
    ) {
        let names: Vec<&str> = all.iter().map(name).collect();
        for (v, n) in all.iter().zip(&names) {
            assert_eq!(from(n), Some(*v), "{n}");
            assert_eq!(names.iter().filter(|m| *m == n).count(), 1, "{n} twice");
        }
        assert_eq!(from("no_such_name"), None);
        assert_eq!(from(""), None);
    }

    #[test]
    fn every_named_enum_reads_its_names_back() {
        check(&Jitter::ALL, Jitter::name, Jitter::from_name);
        check(&Rule::ALL, Rule::name, Rule::from_name);
        check(&Class::ALL, Class::name, Class::from_name);
        check(&Transport::ALL, Transport::name, Transport::from_name);
        check(&Preset::ALL, Preset::name, Preset::from_name);
        check(&RetryAfterMode::ALL, RetryAfterMode::name, RetryAfterMode::from_name);
        check(&Ambiguous::ALL, Ambiguous::name, Ambiguous::from_name);
        assert_eq!(Transport::ALL.len(), 7);
        assert_eq!(Transport::StreamBefore.name(), "stream_broken_before");
        assert_eq!(Rule::Fail as u8, 2);
    }

    #[cfg(feature = "serde")]
    #[test]
    fn the_serde_name_is_the_name() {
        fn same<T: serde::Serialize + serde::de::DeserializeOwned + PartialEq + core::fmt::Debug>(
            v: T,
            name: &str,
        ) {
            assert_eq!(serde_json::to_value(&v).unwrap(), serde_json::Value::from(name));
            assert_eq!(serde_json::from_value::<T>(name.into()).unwrap(), v);
        }
        Jitter::ALL.into_iter().for_each(|v| same(v, v.name()));
        Rule::ALL.into_iter().for_each(|v| same(v, v.name()));
        Class::ALL.into_iter().for_each(|v| same(v, v.name()));
        Transport::ALL.into_iter().for_each(|v| same(v, v.name()));
        Preset::ALL.into_iter().for_each(|v| same(v, v.name()));
        RetryAfterMode::ALL.into_iter().for_each(|v| same(v, v.name()));
        Ambiguous::ALL.into_iter().for_each(|v| same(v, v.name()));
    }
}
