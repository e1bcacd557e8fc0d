module finetune.dev/hack/cluster/pause

go 1.22
