/tmp/zjob/runs/ckpt_kill/checkpoints:
total 16
drwxr-xr-x 4 root root 4096 Dec  1 10:40 .
drwxr-xr-x 4 root root 4096 Dec  1 10:39 ..
drwxr-xr-x 2 root root 4096 Dec  1 10:40 iter_0000004
drwxr-xr-x 2 root root 4096 Dec  1 10:40 iter_0000008.tmp

/tmp/zjob/runs/ckpt_kill/checkpoints/iter_0000004:
total 4151276
drwxr-xr-x 2 root root       4096 Dec  1 10:40 .
drwxr-xr-x 4 root root       4096 Dec  1 10:40 ..
-rw-r--r-- 1 root root 2125333863 Dec  1 10:39 __0_0.distcp
-rw-r--r-- 1 root root 2125338910 Dec  1 10:39 __0_1.distcp
-rw-r--r-- 1 root root      22557 Dec  1 10:39 common.pt
-rw-r--r-- 1 root root     177440 Dec  1 10:40 .metadata
-rw-r--r-- 1 root root        119 Dec  1 10:40 metadata.json
-rw-r--r-- 1 root root       1044 Dec  1 10:40 zebractl.json

/tmp/zjob/runs/ckpt_kill/checkpoints/iter_0000008.tmp:
total 32
drwxr-xr-x 2 root root  4096 Dec  1 10:40 .
drwxr-xr-x 4 root root  4096 Dec  1 10:40 ..
-rw-r--r-- 1 root root 22557 Dec  1 10:40 common.pt
