from rfwp_rl.texttable import format_columns


def test_columns_padded_to_widest_cell():
    text = format_columns(["core", "SPS"], [["rdn", "1,234"], ["lstm", "9"]])
    assert text.split("\n") == ["core    SPS", " rdn  1,234", "lstm      9"]


def test_first_column_left_and_rule():
    text = format_columns(["game", "score"], [["Pong", "21.0"], ["Qbert", "-1"]], first_left=True, rule=True)
    assert text.split("\n") == ["game   score", "-----  -----", "Pong    21.0", "Qbert     -1"]
