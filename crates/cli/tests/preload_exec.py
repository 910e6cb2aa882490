# The preload differential's executor: one JSON operation per line on stdin, run
# under ROOT (argv[1]) with os.* calls, one JSON result per line on stdout. Run
# once under `orion run` (the preload library serves it) and once plainly (the
# mount serves it); the test compares the two after every step.
import errno, hashlib, json, os, sys

root = sys.argv[1]
held = {}  # descriptors kept open across operations, by name


def at(p):
    # No trailing slash for the root itself (such a path goes to the kernel).
    return os.path.join(root, p) if p else root


def snapshot():
    top = os.lstat(root)
    out = [[".", top.st_mode, top.st_uid, top.st_gid]]
    for d, dirs, files in os.walk(root):
        dirs.sort()
        for n in sorted(dirs + files):
            p = os.path.join(d, n)
            st = os.lstat(p)
            row = [os.path.relpath(p, root), st.st_mode, st.st_nlink, st.st_size,
                   st.st_uid, st.st_gid]
            if os.path.islink(p):
                row.append(os.readlink(p))
            elif os.path.isfile(p):
                with open(p, "rb") as f:
                    row.append(hashlib.sha1(f.read()).hexdigest())
            out.append(row)
    return out


def run(o):
    k = o["op"]
    p = at(o.get("path", ""))
    if k == "write":
        fl = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if o["append"] else 0)
        fl |= os.O_TRUNC if o.get("trunc") else 0
        fd = os.open(p, fl, 0o644)
        try:
            if not o["append"]:
                os.lseek(fd, o["off"], os.SEEK_SET)
            n = os.write(fd, bytes([o["seed"]]) * o["len"])
            return [n, os.lseek(fd, 0, os.SEEK_CUR)]
        finally:
            os.close(fd)
    if k == "pread":
        fd = os.open(p, os.O_RDONLY)
        try:
            return hashlib.sha1(os.pread(fd, o["len"], o["off"])).hexdigest()
        finally:
            os.close(fd)
    if k == "truncate":
        return os.truncate(p, o["size"])
    if k == "unlink":
        return os.unlink(p)
    if k == "rename":
        return os.rename(p, at(o["to"]))
    if k == "mkdir":
        return os.mkdir(p, 0o755)
    if k == "rmdir":
        return os.rmdir(p)
    if k == "symlink":
        return os.symlink(o["target"], p)
    if k == "link":
        return os.link(p, at(o["to"]))
    if k == "chmod":
        return os.chmod(p, o["mode"])
    if k == "stat":
        st = os.stat(p)
        return [st.st_mode, st.st_size, st.st_nlink]
    if k == "readlink":
        return os.readlink(p)
    if k == "chown":
        os.chown(p, o["uid"], o["gid"], follow_symlinks=o["follow"])
        st = os.stat(p, follow_symlinks=o["follow"])
        return [st.st_uid, st.st_gid, st.st_mode]
    if k == "utime":
        os.utime(p, ns=(o["atime"], o["mtime"]), follow_symlinks=o["follow"])
        st = os.stat(p, follow_symlinks=o["follow"])
        return [st.st_atime_ns, st.st_mtime_ns]
    if k == "xattr":
        f, name = o["follow"], o["name"]
        if o["do"] == "set":
            return os.setxattr(p, name, o["value"].encode(), o["flags"], follow_symlinks=f)
        if o["do"] == "get":
            return os.getxattr(p, name, follow_symlinks=f).decode()
        if o["do"] == "remove":
            return os.removexattr(p, name, follow_symlinks=f)
        return sorted(os.listxattr(p, follow_symlinks=f))
    if k == "listdir":
        # Names, types and inode numbers as a directory stream gives them.
        return sorted(
            [e.name, e.is_dir(follow_symlinks=False), e.is_symlink(),
             e.inode() == os.lstat(e.path).st_ino]
            for e in os.scandir(p)
        )
    if k == "hold":
        # Open and keep: later operations use the descriptor after the name changed.
        fd = os.open(p, os.O_RDWR)
        held[o["name"]] = fd
        return os.fstat(fd).st_size
    if k == "use":
        fd = held.get(o["name"])
        if fd is None:
            return "none"
        os.pwrite(fd, bytes([o["seed"]]) * o["len"], o["off"])
        d = os.dup(fd)
        os.lseek(d, 0, os.SEEK_SET)
        data = os.read(fd, 1 << 20)
        os.close(d)
        st = os.fstat(fd)
        return [st.st_nlink, st.st_size, hashlib.sha1(data).hexdigest()]
    if k == "drop":
        fd = held.pop(o["name"], None)
        if fd is not None:
            os.fsync(fd)
            os.close(fd)
        return None
    if k == "snapshot":
        return snapshot()
    raise ValueError(k)


for line in sys.stdin:
    o = json.loads(line)
    try:
        r = {"ok": run(o)}
    except OSError as e:
        r = {"err": errno.errorcode.get(e.errno, str(e.errno))}
    print(json.dumps(r), flush=True)
