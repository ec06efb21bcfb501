# Sourced by run.sh and stage_procgen.sh: ProcGen unpacked by stage_procgen.sh into .procgen-site/
# (its Python packages on PYTHONPATH, the system libraries it carried on LD_LIBRARY_PATH), where that
# folder was made for this Python's version ($PYTHON; its cffi is a compiled wheel); else nothing.
_procgen_site="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/.procgen-site"
if [[ -f "$_procgen_site/.python" ]] && [[ "$(cat "$_procgen_site/.python")" == \
        "$("${PYTHON:-python3}" -c 'import sys; print("%d.%d" % sys.version_info[:2])')" ]]; then
    export PYTHONPATH="$_procgen_site${PYTHONPATH:+:$PYTHONPATH}"
    for _dir in "$_procgen_site/lib/usr/lib/x86_64-linux-gnu" "$_procgen_site/lib/lib/x86_64-linux-gnu"; do
        if [[ -d "$_dir" ]]; then
            export LD_LIBRARY_PATH="$_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
        fi
    done
fi
unset _procgen_site _dir
