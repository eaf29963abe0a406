//! Helpers shared by the two command-line programs (included by each binary).

/// The error and its causes as one line: causes joined with `: `, a cause the line already
/// contains skipped, newlines turned into spaces.
pub fn one_line(e: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in e.chain() {
        let s = cause.to_string().replace('\n', " ");
        if line.contains(&s) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&s);
    }
    line
}
