//! Output for a person: aligned columns, coloured on a terminal, plain when piped or
//! when `NO_COLOR` is set.

use std::io::IsTerminal;

/// Whether to colour: stdout is a terminal and `NO_COLOR` is unset or empty
/// (<https://no-color.org>).
pub fn color_wanted() -> bool {
    let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
    !no_color && std::io::stdout().is_terminal()
}

/// A palette that is either ANSI colours or nothing.
#[derive(Debug, Clone, Copy)]
pub struct Style {
    color: bool,
}

impl Style {
    /// Colours on or off.
    pub fn new(color: bool) -> Self {
        Style { color }
    }

    /// Whether colours are on.
    pub fn color(self) -> bool {
        self.color
    }

    fn paint(self, code: &str, text: &str) -> String {
        if self.color {
            format!("\x1b[{code}m{text}\x1b[0m")
        } else {
            text.to_owned()
        }
    }

    /// Good news.
    pub fn green(self, text: &str) -> String {
        self.paint("32", text)
    }

    /// Something to look at.
    pub fn yellow(self, text: &str) -> String {
        self.paint("33", text)
    }

    /// Bad news.
    pub fn red(self, text: &str) -> String {
        self.paint("31", text)
    }

    /// Taken from the journal.
    pub fn cyan(self, text: &str) -> String {
        self.paint("36", text)
    }

    /// Background detail.
    pub fn dim(self, text: &str) -> String {
        self.paint("2", text)
    }

    /// Headings.
    pub fn bold(self, text: &str) -> String {
        self.paint("1", text)
    }
}

/// Width of the first column (tool names).
pub const NAME_WIDTH: usize = 14;
/// Width of the second column (replay classes).
pub const CLASS_WIDTH: usize = 20;

/// One narration line, `  name  class  text`, aligned (padding is applied before
/// colour; `text` comes styled).
pub fn row_styled(style: Style, name: &str, class: &str, text: String) -> String {
    format!(
        "  {} {} {text}",
        style.bold(&format!("{name:<NAME_WIDTH$}")),
        style.dim(&format!("{class:<CLASS_WIDTH$}"))
    )
}
