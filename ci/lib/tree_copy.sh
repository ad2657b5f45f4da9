# Sourced by legs that work on a private copy of the tree (cpu-paddle-2.6.2, packaging);
# never run as a leg itself.

# tree_copy DEST: the tree's sources into DEST: the files git tracks and the untracked
# ones it does not ignore, as they are in the working tree, so nothing a build or another
# leg left (venvs, build/, .ci-logs/, the in-place op library) comes along. It names the
# files one by one instead of archiving the folder: the legs run side by side, and a tar
# of "." failed with "file changed as we read it" (exit 1) when the main leg created .venv
# at the same moment.
tree_copy() {
  mkdir -p "$1"
  git ls-files -z --cached --others --exclude-standard | tar --null -T - -cf - | tar -xf - -C "$1"
}
