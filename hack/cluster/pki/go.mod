module finetune.dev/hack/cluster/pki

go 1.22
