//! [`without_strings`]: a parser's message about a tenants file without the
//! string values it quotes. A key pasted by mistake where a list of hashes
//! belongs (`keys = "sk-live-…"`) made the TOML and JSON parsers say
//! `invalid type: string "sk-live-…", expected a sequence`, and that
//! message went to the log (at start, and on each SIGHUP that reloads the
//! file).

/// `message` with each `string "<value>"` (serde's words for an unexpected
/// string, the value escaped as Rust's `{:?}` does) said as `a string`.
pub(super) fn without_strings(message: &str) -> String {
    const QUOTED: &str = "string \"";
    let mut out = String::with_capacity(message.len());
    let mut rest = message;
    while let Some(at) = rest.find(QUOTED) {
        out.push_str(&rest[..at]);
        out.push_str("a string");
        let mut chars = rest[at + QUOTED.len()..].char_indices();
        let mut end = None;
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => {
                    chars.next();
                }
                '"' => {
                    end = Some(i + 1);
                    break;
                }
                _ => {}
            }
        }
        // Unterminated: nothing after the opening quote is kept.
        let Some(end) = end else { return out };
        rest = &rest[at + QUOTED.len() + end..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoted_strings_go_and_the_rest_stays() {
        let said = |value: &str| format!("invalid type: string {value:?}, expected a sequence");
        assert_eq!(without_strings(&said("sk-live-1")), "invalid type: a string, expected a sequence");
        assert_eq!(without_strings(&said("a \"quoted\" \\ key")), "invalid type: a string, expected a sequence");
        assert_eq!(without_strings("integer `5`, expected a string"), "integer `5`, expected a string");
        assert_eq!(without_strings("string \"a\" and string \"b\"!"), "a string and a string!");
        assert_eq!(without_strings("cut string \"sk-li"), "cut a string");
    }
}
