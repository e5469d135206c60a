//! Text tables for people, as `--inspect` and `dlock cluster status` print
//! them: rows under a header, each column as wide as its widest cell
//! (counted in characters, so a key in UTF-8 lines up), two spaces apart,
//! no spaces at the end of a line.

/// `rows` under `header`; the columns numbered in `right` are aligned to
/// the right (numbers), the others to the left.
pub fn columns<const N: usize>(
    header: &[String; N],
    rows: &[[String; N]],
    right: &[usize],
) -> String {
    let mut widths = header.clone().map(|h| h.chars().count());
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in std::iter::once(header).chain(rows) {
        let cells: Vec<String> = row
            .iter()
            .zip(widths)
            .enumerate()
            .map(|(col, (cell, w))| match right.contains(&col) {
                true => format!("{cell:>w$}"),
                false => format!("{cell:<w$}"),
            })
            .collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_fit_their_widest_cell_in_characters() {
        let header = ["KEY", "N"].map(String::from);
        let rows = [
            ["ключ".to_string(), "7".into()],
            ["a".into(), "1234".into()],
        ];
        assert_eq!(
            columns(&header, &rows, &[1]),
            "KEY      N\nключ     7\na     1234\n"
        );
    }
}
