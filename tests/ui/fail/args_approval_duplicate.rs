// `approval` may appear once; the second one is reported.
use durable::durable_tool;

/// Delete a file.
#[durable_tool(replay = "unsafe_on_replay", approval = "required", approval = risky)]
async fn delete_file(path: String) -> Result<(), std::io::Error> {
    std::fs::remove_file(path)
}

fn risky(args: &DeleteFileArgs) -> bool {
    args.path.starts_with('/')
}

fn main() {}
